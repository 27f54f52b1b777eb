//! The kernel adapter: maps fuser 0.18 callbacks onto [`View`] and nothing
//! else. The only module that imports fuser.
//!
//! Each request gets one `tracing` span (`op`, `ino`, `pid`), runs its
//! `View` call under `catch_unwind` (a panic would otherwise kill the worker
//! thread and hang later requests; it is answered `EIO`), and leaves through
//! one error exit that logs and replies the errno.
//! With [`MountOptions::requests`] (`--metrics`) each request is also timed,
//! by operation, from the handler's start to its reply.
//!
//! Files of at least [`PASSTHROUGH_MIN_SIZE`] are served by kernel
//! passthrough when the kernel grants it and `STAGEFS_NO_PASSTHROUGH` is
//! unset (one `BackingId` per inode shared by concurrent opens, dropped at
//! the last release); smaller ones, and all without passthrough, by `pread`
//! on the handle's descriptor with the page cache kept (contents are
//! immutable, so one READ per page ever). The status file uses direct I/O.
//!
//! No-open mode ([`MountOptions::no_open`], `STAGEFS_NO_OPEN=1`): the first
//! read-only OPEN is answered `ENOSYS`, after which the kernel opens every
//! file without a request and never sends RELEASE; reads arrive with file
//! handle 0 and are served by inode ([`View::read_inode`]). That saves two
//! round trips per open, at three costs written down in
//! docs/SEMANTICS.md: no passthrough, the status file is a fresh copy per
//! lookup rather than per open, and a process with `CAP_DAC_OVERRIDE`
//! (root) can open a file for writing (its writes still fail `EROFS`).
//!
//! [`mount`] mounts read-write at the VFS level — with `ro` the kernel would
//! refuse `setxattr` (pins) itself — and every data-changing operation is
//! answered `EROFS` here. There is no `default_permissions`: the kernel
//! asks the daemon, which answers `EROFS` for every change (also to users
//! who could not write by the modes), lets every user the mount admits read,
//! and lets only the mounting user and root change pins (`EPERM` for others).
//! Not running as root, it mounts and unmounts through `fusermount3`
//! ([`crate::fusermount`]). Called by the daemon and the mount tests.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, BackingId, BsdFileFlags, Config, CopyFileRangeFlags, Errno, FileAttr, FileHandle,
    FileType, Filesystem, FopenFlags, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    MountOption, OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyBmap,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    Session, SessionACL, TimeOrNow, WriteFlags,
};
use tracing::{debug, error, info, warn};

use crate::fusermount;
use crate::latency::{FuseOp, FuseRequests, RequestTimer};
use crate::view::{readers, Attr, Caller, DentryAction, FileKind, OpenContent, View, ViewError};

/// Why mounting or unmounting failed.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    #[error("mounting {path}: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the FUSE session thread: {0}")]
    Spawn(std::io::Error),
    #[error("unmounting {path}: {source}")]
    Unmount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the FUSE session thread panicked")]
    SessionPanicked,
}

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Let other users read the mount (`allow_other`).
    pub allow_other: bool,
    /// FUSE worker threads (at least 1).
    pub threads: usize,
    /// Let the kernel open files without asking (see the module docs);
    /// ignored when the kernel lacks `FUSE_NO_OPEN_SUPPORT`.
    pub no_open: bool,
    /// Time every request by operation into this (`--metrics`); None
    /// costs nothing.
    pub requests: Option<Arc<FuseRequests>>,
}

impl Default for MountOptions {
    /// Two threads, owner only; no-open when `STAGEFS_NO_OPEN` is set.
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            threads: 2,
            no_open: env_flag("STAGEFS_NO_OPEN"),
            requests: None,
        }
    }
}

/// Whether environment variable `name` is set to something but `0`.
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Files at least this large are read through kernel passthrough. Below
/// it a file fits one READ request (the kernel's 1 MiB cap), served once
/// into the kept page cache, where a backing file per open (an `open` of
/// the blob plus two ioctls) would cost more than it saves.
pub const PASSTHROUGH_MIN_SIZE: u64 = 1 << 20;

/// Readahead for the mount's bdi: sequential reads of large staged files
/// are the main workload (FUSER-NOTES: 1 MiB readahead measured best).
const READ_AHEAD_KB: u32 = 1024;

/// How long `unmount` retries a busy mount before detaching it lazily.
const BUSY_RETRY: Duration = Duration::from_secs(2);

/// Kernel passthrough state: shared backing ids per inode.
#[derive(Default)]
struct Backing {
    by_ino: HashMap<u64, Arc<BackingId>>,
    /// Open handle → (inode, its backing id).
    by_fh: HashMap<u64, (u64, Arc<BackingId>)>,
}

struct StagefsFs {
    view: Arc<View>,
    /// The mounting user: with root, the only one who may change pins.
    owner_uid: u32,
    /// Who may use the mount (sessions' own connections get the same).
    acl: SessionACL,
    passthrough: bool,
    /// Asked for by the mount options; `no_open` once the kernel agreed.
    want_no_open: bool,
    no_open: bool,
    /// A session's own connection: directories are opened without a
    /// request too (every one is immutable), once the kernel agreed.
    want_no_opendir: bool,
    no_opendir: bool,
    backing: Mutex<Backing>,
    /// Per-operation timing, when metrics are exported.
    requests: Option<Arc<FuseRequests>>,
}

/// Replies that can carry an errno; lets one helper answer every error.
trait ErrorReply {
    fn error(self, e: Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl ErrorReply for $t {
            fn error(self, e: Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}
error_reply!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyOpen,
    ReplyWrite,
    ReplyXattr
);

/// Runs one view call: catches panics, logs errors once.
fn guarded<T>(op: &'static str, f: impl FnOnce() -> Result<T, ViewError>) -> Result<T, Errno> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            if e.is_routine() {
                debug!(op, error = %e, "request failed");
            } else {
                warn!(op, error = %e, "request failed");
            }
            Err(Errno::from_i32(e.errno()))
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            error!(op, panic = %msg, "request handler panicked; answering EIO");
            Err(Errno::EIO)
        }
    }
}

/// The single error exit: on `Err` reply the errno, else hand the value
/// and the reply to `ok`.
fn answer<R: ErrorReply, T>(reply: R, result: Result<T, Errno>, ok: impl FnOnce(R, T)) {
    match result {
        Ok(v) => ok(reply, v),
        Err(e) => reply.error(e),
    }
}

fn span(op: &'static str, ino: u64, req: &Request) -> tracing::span::EnteredSpan {
    tracing::debug_span!("fuse", op, ino, pid = req.pid()).entered()
}

/// The request's caller, for the view layer's per-reader views and the
/// bound on what other users' handles hold.
fn caller(req: &Request) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Directory => FileType::Directory,
        FileKind::RegularFile => FileType::RegularFile,
    }
}

/// Answers an xattr value or name list with the size-probe protocol.
fn reply_xattr(reply: ReplyXattr, size: u32, data: Vec<u8>) {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(&data);
    }
}

/// One request's span and, with metrics, its timer: both end when it drops
/// (after the reply, which every handler sends before returning).
struct Handling<'a> {
    _timer: Option<RequestTimer<'a>>,
    _span: tracing::span::EnteredSpan,
    _served: Served<'a>,
}

/// Tells the readers, once a request was answered (dropped after the
/// reply), that its process's gap starts now and the request is no longer
/// in flight (see `Readers::begin` and `Readers::served`).
struct Served<'a> {
    readers: &'a readers::Readers,
    pid: u32,
}

impl Drop for Served<'_> {
    fn drop(&mut self) {
        self.readers.served(self.pid);
        readers::handler_ended();
    }
}

impl StagefsFs {
    /// Serves `view` for `owner_uid` (opens ask the daemon until
    /// [`StagefsFs::opening_without_requests`]).
    fn new(
        view: Arc<View>,
        owner_uid: u32,
        acl: SessionACL,
        requests: Option<Arc<FuseRequests>>,
    ) -> StagefsFs {
        StagefsFs {
            view,
            owner_uid,
            acl,
            passthrough: false,
            want_no_open: false,
            no_open: false,
            want_no_opendir: false,
            no_opendir: false,
            backing: Mutex::new(Backing::default()),
            requests,
        }
    }

    /// Asks the kernel, at INIT, to open files (`files`) and directories
    /// (`dirs`) without a request.
    fn opening_without_requests(mut self, files: bool, dirs: bool) -> StagefsFs {
        self.want_no_open = files;
        self.want_no_opendir = dirs;
        self
    }

    fn timer(&self, op: FuseOp) -> Option<RequestTimer<'_>> {
        self.requests.as_deref().map(|r| r.start(op))
    }

    fn request(&self, op: FuseOp, ino: u64, req: &Request) -> Handling<'_> {
        readers::handler_began();
        self.view.readers().begin(req.pid());
        Handling {
            _timer: self.timer(op),
            _span: span(op.label(), ino, req),
            _served: Served {
                readers: self.view.readers(),
                pid: req.pid(),
            },
        }
    }

    fn read_only<R: ErrorReply>(&self, op: &'static str, ino: u64, req: &Request, reply: R) {
        let _t = self.timer(FuseOp::Refused);
        let _s = span(op, ino, req);
        debug!("refused: read-only mount");
        reply.error(Errno::EROFS);
    }

    /// Pins are the mounting user's (and root's): other users, let in by
    /// `--allow-other`, only read (`EPERM`). The mount has no
    /// `default_permissions`, so this check is the daemon's, not the kernel's.
    fn may_change_pins(&self, req: &Request) -> Result<(), Errno> {
        let uid = req.uid();
        if uid == 0 || uid == self.owner_uid {
            Ok(())
        } else {
            debug!(uid, "refused: only the mounting user and root change pins");
            Err(Errno::EPERM)
        }
    }

    fn lock_backing(&self) -> MutexGuard<'_, Backing> {
        // Map updates are single inserts/removes; a poisoned lock is still
        // consistent.
        self.backing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replies to an open of a staged file: passthrough when possible and
    /// the file is large enough to gain from it.
    fn open_blob(&self, ino: u64, fh: u64, file: &std::fs::File, size: u64, reply: ReplyOpen) {
        if self.passthrough && size >= PASSTHROUGH_MIN_SIZE {
            let mut backing = self.lock_backing();
            let id = match backing.by_ino.get(&ino) {
                Some(id) => Some(Arc::clone(id)),
                None => match reply.open_backing(file) {
                    Ok(id) => {
                        let id = Arc::new(id);
                        backing.by_ino.insert(ino, Arc::clone(&id));
                        Some(id)
                    }
                    Err(e) => {
                        warn!(ino, error = %e, "passthrough refused; serving reads in userspace");
                        None
                    }
                },
            };
            if let Some(id) = id {
                backing.by_fh.insert(fh, (ino, Arc::clone(&id)));
                drop(backing);
                // Read-only content: nothing to flush on close, so the
                // kernel can skip the FLUSH round trip.
                reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_NOFLUSH, &id);
                return;
            }
        }
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        );
    }

    /// `user.stagefs.connection` on the root (`stagefs run
    /// --private-mount`): `value` is the number of a `/dev/fuse`
    /// descriptor the caller, a session's leader, has just mounted on the
    /// mountpoint in its own mount namespace. The daemon takes the
    /// descriptor out of the caller (`pidfd_getfd`; root callers only, as
    /// the namespace already requires) and serves the session's state on
    /// it: every name immutable, no-open mode where the kernel has it
    /// (no request for an open or a close). Answered once the connection
    /// is initialised; the connection is served until the kernel ends it
    /// (the last process of the namespace gone), and its state stays a GC
    /// root until then ([`View::session_view`]).
    fn serve_session_connection(&self, req: &Request, ino: u64, value: &[u8]) -> Result<(), Errno> {
        if req.uid() != 0 {
            debug!(
                uid = req.uid(),
                "refused: only root hands over a connection"
            );
            return Err(Errno::EPERM);
        }
        if ino != crate::view::ROOT {
            return Err(Errno::EINVAL);
        }
        let number = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
            .filter(|n| *n >= 0)
            .ok_or(Errno::EINVAL)?;
        let view = guarded("session connection", || self.view.session_view(caller(req)))?;
        let state = view.fixed_state();
        let fd = take_fuse_fd(req.pid(), number).map_err(|e| {
            warn!(pid = req.pid(), fd = number, error = %e, "cannot take the session's FUSE descriptor");
            Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
        })?;
        let fs = StagefsFs::new(view, self.owner_uid, self.acl, self.requests.clone())
            .opening_without_requests(true, true);
        let mut cfg = Config::default();
        cfg.acl = self.acl;
        cfg.n_threads = Some(2);
        cfg.clone_fd = true;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("stagefs-session".into())
            .spawn(move || match Session::from_fd(fs, fd, cfg.acl, cfg) {
                Ok(session) => {
                    let _ = tx.send(Ok(()));
                    info!(?state, "serving a session on its own connection");
                    if let Err(e) = session.run() {
                        warn!(?state, error = %e, "a session's connection ended with an error");
                    }
                    info!(?state, "a session's own connection ended");
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a thread for a session's connection");
            return Err(Errno::EAGAIN);
        }
        match rx.recv_timeout(HANDSHAKE_WAIT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                warn!(error = %e, "a session's connection failed its handshake");
                Err(Errno::EIO)
            }
            Err(_) => {
                warn!("a session's connection sent no INIT in time");
                Err(Errno::ETIMEDOUT)
            }
        }
    }

    fn release_backing(&self, fh: u64) {
        let mut backing = self.lock_backing();
        if let Some((ino, id)) = backing.by_fh.remove(&fh) {
            // Two references left (the inode map and ours) = last open.
            if Arc::strong_count(&id) == 2 {
                backing.by_ino.remove(&ino);
            }
        }
    }
}

impl Filesystem for StagefsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS) {
            info!(?missing, "kernel lacks parallel directory operations");
        }
        // A cold walk (`find`, `ls -l`) gets each directory page's entries
        // with their attributes in one request. Always, not the kernel's
        // adaptive mode (FUSE_READDIRPLUS_AUTO): that uses readdirplus for
        // a directory's first page only until lookups follow, and tools
        // built on fts (`find`, `ls`, `du`) read a whole directory before
        // they stat anything, so every later page cost one LOOKUP per
        // entry (measured in docs/benchmarks/HISTORY.md). The price: each listed
        // entry is a kernel inode (and a view reference) until the kernel
        // reclaims it.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS) {
            info!(?missing, "kernel lacks readdirplus");
        }
        let capabilities = config.capabilities();
        let supported = capabilities.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        // A reader host's files may be fetched as they are read, which
        // needs a handle per open.
        self.no_open = self.want_no_open && supported && !self.view.serves_fetched();
        if self.want_no_open && !self.no_open {
            info!(
                supported,
                "no-open mode not used: every open asks the daemon"
            );
        }
        self.view.set_no_open(self.no_open);
        self.no_opendir =
            self.want_no_opendir && capabilities.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        // STAGEFS_NO_PASSTHROUGH=1 serves reads in userspace (benchmarks,
        // and a way out should a kernel's passthrough misbehave). No-open
        // files are never passthrough: the kernel asks for no backing file.
        let opted_out = env_flag("STAGEFS_NO_PASSTHROUGH");
        let passthrough = !opted_out
            && !self.no_open
            && config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_ok()
            // Default depth 0 makes every open_backing fail with EPERM.
            && config.set_max_stack_depth(1).is_ok();
        self.passthrough = passthrough;
        info!(
            passthrough,
            opted_out,
            no_open = self.no_open,
            "FUSE session initialised"
        );
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _s = self.request(FuseOp::Lookup, parent.0, req);
        let r = guarded("lookup", || self.view.lookup(parent.0, name, caller(req)));
        answer(reply, r, |reply, e| {
            reply.entry_with_ttls(
                &e.attr_ttl,
                &e.entry_ttl,
                &file_attr(&e.attr),
                fuser::Generation(0),
            )
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.timer(FuseOp::Forget);
        let _ = guarded("forget", || {
            self.view.forget(ino.0, nlookup);
            Ok(())
        });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _s = self.request(FuseOp::Getattr, ino.0, req);
        let r = guarded("getattr", || self.view.getattr(ino.0, caller(req)));
        answer(reply, r, |reply, (attr, ttl)| {
            reply.attr(&ttl, &file_attr(&attr))
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.read_only("setattr", ino.0, req, reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _s = self.request(FuseOp::Opendir, ino.0, req);
        if self.no_opendir {
            // ENOSYS: the kernel opens directories itself from now on
            // (this one too), and reads them with file handle 0.
            return reply.error(Errno::ENOSYS);
        }
        let r = guarded("opendir", || self.view.opendir(ino.0, caller(req)));
        answer(reply, r, |reply, d| {
            let flags = if d.immutable {
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            };
            reply.opened(FileHandle(d.fh), flags)
        });
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _s = self.request(FuseOp::Readdir, ino.0, req);
        let add = |e: crate::view::DirEntry| {
            reply.add(INodeNo(e.ino), e.offset, file_type(e.kind), &*e.name)
        };
        let r = guarded("readdir", || match fh.0 {
            0 => self.view.readdir_unopened(ino.0, offset, caller(req), add),
            fh => self.view.readdir(fh, offset, add),
        });
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _s = self.request(FuseOp::Readdirplus, ino.0, req);
        let r = guarded("readdirplus", || {
            self.view
                .readdirplus(ino.0, fh.0, offset, caller(req), |e, entry| {
                    // One TTL for both in fuser's readdirplus entries: the
                    // shorter one, so zero-TTL names stay zero.
                    let ttl = entry.entry_ttl.min(entry.attr_ttl);
                    reply.add(
                        INodeNo(e.ino),
                        e.offset,
                        &*e.name,
                        &ttl,
                        &file_attr(&entry.attr),
                        fuser::Generation(0),
                    )
                })
        });
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _s = self.request(FuseOp::Releasedir, ino.0, req);
        let r = guarded("releasedir", || {
            self.view.releasedir(fh.0);
            Ok(())
        });
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _s = self.request(FuseOp::Open, ino.0, req);
        let r = guarded("open", || self.view.open(ino.0, flags.0, caller(req)));
        answer(reply, r, |reply, opened| {
            if self.no_open {
                // A read-only open that would succeed: ENOSYS tells the
                // kernel to open files itself from now on (this one too).
                self.view.release(opened.fh);
                debug!("answering ENOSYS: the kernel opens files without asking from now on");
                return reply.error(Errno::ENOSYS);
            }
            match &opened.content {
                OpenContent::Blob { file, size } => {
                    self.open_blob(ino.0, opened.fh, file, *size, reply)
                }
                OpenContent::Generated => {
                    reply.opened(FileHandle(opened.fh), FopenFlags::FOPEN_DIRECT_IO)
                }
                // Immutable bytes, served as they arrive: the page cache
                // keeps what was read.
                OpenContent::Fetched => reply.opened(
                    FileHandle(opened.fh),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
                ),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _s = self.request(FuseOp::Read, ino.0, req);
        // File handle 0: opened without a request (no-open mode).
        let r = guarded("read", || match fh.0 {
            0 => self.view.read_inode(ino.0, offset, size),
            fh => self.view.read(fh, offset, size),
        });
        answer(reply, r, |reply, data| reply.data(&data));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.timer(FuseOp::Flush);
        // Nothing is ever buffered for writing: ENOSYS tells the kernel to
        // stop sending FLUSH at every close (no-open files, whose flags
        // cannot carry FOPEN_NOFLUSH, and the status file).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _s = self.request(FuseOp::Release, ino.0, req);
        let r = guarded("release", || {
            self.view.release(fh.0);
            self.release_backing(fh.0);
            Ok(())
        });
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _s = self.request(FuseOp::Getxattr, ino.0, req);
        let r = guarded("getxattr", || self.view.getxattr(ino.0, name, caller(req)));
        answer(reply, r, |reply, data| reply_xattr(reply, size, data));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _s = self.request(FuseOp::Listxattr, ino.0, req);
        let r = guarded("listxattr", || self.view.listxattr(ino.0, caller(req)));
        answer(reply, r, |reply, data| reply_xattr(reply, size, data));
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _s = self.request(FuseOp::Setxattr, ino.0, req);
        if name == crate::view::CONNECTION_XATTR {
            return match self.serve_session_connection(req, ino.0, value) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        // Warming only fetches what a read would: anyone who may read.
        let may = match name == crate::view::WARM_XATTR {
            true => Ok(()),
            false => self.may_change_pins(req),
        };
        if let Err(e) = may {
            return reply.error(e);
        }
        let r = guarded("setxattr", || {
            self.view.setxattr(ino.0, name, value, caller(req))
        });
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _s = self.request(FuseOp::Removexattr, ino.0, req);
        if let Err(e) = self.may_change_pins(req) {
            return reply.error(e);
        }
        let r = guarded("removexattr", || {
            self.view.removexattr(ino.0, name, caller(req))
        });
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _s = self.request(FuseOp::Access, ino.0, req);
        let r = guarded("access", || self.view.access(ino.0, mask.bits()));
        answer(reply, r, |reply, ()| reply.ok());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.timer(FuseOp::Statfs);
        // Nothing can be written: no free space to report.
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        self.read_only("mknod", parent.0, req, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.read_only("mkdir", parent.0, req, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        self.read_only("unlink", parent.0, req, reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        self.read_only("rmdir", parent.0, req, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        self.read_only("symlink", parent.0, req, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.read_only("rename", parent.0, req, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.read_only("link", ino.0, req, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        self.read_only("create", parent.0, req, reply);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.read_only("write", ino.0, req, reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        self.read_only("fallocate", ino.0, req, reply);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.read_only("copy_file_range", ino_out.0, req, reply);
    }

    // The operations below are ones ordinary readers cause and fuser's
    // defaults answer with a warning per request (issue 32: Python's
    // `open()` probes `isatty` with ioctl TCGETS on every file). They are
    // answered here quietly, at debug level at most.

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _s = span("ioctl", ino.0, req);
        // No ioctl applies to a plain read-only file: ENOTTY, as a regular
        // file on a local file system answers TCGETS.
        debug!(cmd, "ioctl: ENOTTY");
        reply.error(Errno::ENOTTY);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Nothing on the mount is ever written: there is nothing to sync.
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _s = span("readlink", ino.0, req);
        // The mount holds directories and regular files only.
        debug!("readlink of a non-symlink: EINVAL");
        reply.error(Errno::EINVAL);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        // ENOSYS: the kernel stops asking and seeks itself (SEEK_DATA and
        // SEEK_HOLE then treat every file as one data extent, which it is).
        reply.error(Errno::ENOSYS);
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // ENOSYS: the kernel stops asking and reports files always ready.
        reply.error(Errno::ENOSYS);
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        // Locks stay in the kernel (no FUSE_POSIX_LOCKS): ENOSYS.
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        // Only for block-device (fuseblk) mounts.
        reply.error(Errno::ENOSYS);
    }
}

/// Set when the session thread has exited, for whoever waits on it.
#[derive(Default)]
struct Ended {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Ended {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A live mount. Dropping it without [`Mounted::unmount`] still unmounts
/// (lazily, logged), so no dead mount is left behind.
pub struct Mounted {
    /// Mounted by `fusermount3` (not root): unmounted by it too.
    via_fusermount: bool,
    mountpoint: PathBuf,
    /// `st_dev` of the mount: its FUSE connection id is the minor.
    dev: u64,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    ended: Arc<Ended>,
}

/// Keeps the kernel's table entries in line with readers (outside
/// request handlers, FUSER-NOTES): every [`MAINTAIN_EVERY`], and at once
/// after a catalog change, carries out [`View::dentry_plan`] — drops
/// unused entries of old versions (the kernel then forgets them and their
/// blobs can go) and moves table directories still in use (working
/// directories) to their snapshot paths, so `getcwd()` keeps a real path —
/// then ends sessions whose leader exited and forgets idle views.
fn maintain_entries(view: &View, mountpoint: &Path, notifier: &fuser::Notifier, ended: &Ended) {
    let mut last_snapshot = None;
    let mut last_pass = Instant::now();
    let mut last_prune = Instant::now();
    while !*ended.lock() {
        let snapshot = view.catalog().snapshot();
        let changed = !last_snapshot
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &snapshot));
        let due = view.take_dentries_due();
        if changed || due || last_pass.elapsed() >= MAINTAIN_EVERY {
            last_snapshot = Some(snapshot);
            last_pass = Instant::now();
            for action in view.dentry_plan(mountpoint, || readers::cwds_under(mountpoint)) {
                match action {
                    DentryAction::Invalidate { parent, name } => {
                        // ENOENT: the kernel had already dropped it.
                        match notifier.inval_entry(INodeNo(parent), OsStr::new(&*name)) {
                            Ok(()) => view.readers().count_invalidation(),
                            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                            Err(e) => {
                                debug!(parent, name = %name, error = %e, "inval_entry failed")
                            }
                        }
                    }
                    DentryAction::Splice { ino, path } => match std::fs::symlink_metadata(&path) {
                        Ok(md) if md.ino() == ino => view.spliced(ino),
                        Ok(md) => {
                            view.splice_failed(ino);
                            debug!(path = %path.display(), ino, found = md.ino(), "splice found another inode")
                        }
                        Err(e) => {
                            view.splice_failed(ino);
                            debug!(path = %path.display(), error = %e, "splice lookup failed")
                        }
                    },
                }
            }
            view.maintain_readers();
            // An fstat per kept descriptor: at most every pass interval,
            // however often commits come.
            if last_prune.elapsed() >= MAINTAIN_EVERY {
                last_prune = Instant::now();
                view.prune_blob_files();
            }
        }
        // Every few milliseconds: each reader's gap gets its CPU-wait
        // mark near its start (see `Readers::mark_quiet`).
        view.readers().mark_quiet();
        let guard = ended.lock();
        let _ = ended.cv.wait_timeout(guard, MARK_EVERY);
    }
}

/// How long a session's connection may take to send its INIT (already
/// queued when the caller hands it over).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Duplicates descriptor `number` of process `pid` into this one
/// (`pidfd_getfd`: this process must be allowed to trace it) and checks it
/// is the FUSE device.
fn take_fuse_fd(pid: u32, number: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: plain syscalls; every returned descriptor is owned at once.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: as above.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            number,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd returned a new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let md = std::fs::File::from(fd.try_clone()?).metadata()?;
    use std::os::unix::fs::FileTypeExt;
    // /dev/fuse is character device 10:229.
    if !md.file_type().is_char_device() || md.rdev() != libc::makedev(10, 229) {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    Ok(fd)
}

/// How often [`maintain_entries`] runs when nothing changed.
const MAINTAIN_EVERY: Duration = Duration::from_millis(250);
/// How often the maintenance thread marks quiet readers' run delays: with
/// `readers::MARK_QUIET_AFTER`, a gap's mark lands 5–15 ms after it began,
/// well inside the shortest pause the view rule acts on (40 ms).
const MARK_EVERY: Duration = Duration::from_millis(10);

/// Mounts `view` at `mountpoint` and starts serving it; returns once the
/// mount answers requests.
pub fn mount(
    view: Arc<View>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<Mounted, FuseError> {
    let mount_err = |source| FuseError::Mount {
        path: mountpoint.to_owned(),
        source,
    };
    let mountpoint = mountpoint.canonicalize().map_err(mount_err)?;
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("stagefs".into()),
        MountOption::Subtype("stagefs".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoExec,
        MountOption::NoAtime,
    ];
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = opts.threads > 1;
    // SAFETY: getuid cannot fail.
    let owner_uid = unsafe { libc::getuid() };
    let fs = StagefsFs::new(view, owner_uid, cfg.acl, opts.requests.clone())
        .opening_without_requests(opts.no_open, false);
    let view = Arc::clone(&fs.view);
    view.set_mountpoint(&mountpoint);
    let via_fusermount = fusermount::needed();
    let session = if via_fusermount {
        // Not root: /dev/fuse may be closed to us and mount(2) is root's.
        let mut options = "fsname=stagefs,subtype=stagefs,nosuid,nodev,noexec,noatime".to_owned();
        if opts.allow_other {
            options.push_str(",allow_other");
        }
        let fd = fusermount::mount(&mountpoint, &options).map_err(mount_err)?;
        let acl = cfg.acl;
        Session::from_fd(fs, fd, acl, cfg).map_err(|e| {
            let _ = fusermount::unmount(&mountpoint, true);
            mount_err(e)
        })?
    } else {
        Session::new(fs, &mountpoint, &cfg).map_err(mount_err)?
    };
    let maintained = mountpoint.clone();
    let notifier = session.notifier();
    let ended = Arc::new(Ended::default());
    {
        // Invalidation runs here, never in a request handler (FUSER-NOTES:
        // inval_entry from a handler can deadlock in the kernel).
        let ended = Arc::clone(&ended);
        std::thread::Builder::new()
            .name("stagefs-inval".into())
            .spawn(move || maintain_entries(&view, &maintained, &notifier, &ended))
            .map_err(FuseError::Spawn)?;
    }
    let thread = {
        let ended = Arc::clone(&ended);
        std::thread::Builder::new()
            .name("stagefs-fuse".into())
            .spawn(move || {
                let r = session.run();
                if let Err(e) = &r {
                    error!(error = %e, "FUSE session ended with an error");
                }
                *ended.lock() = true;
                ended.cv.notify_all();
                r
            })
            .map_err(FuseError::Spawn)?
    };
    let mut mounted = Mounted {
        via_fusermount,
        mountpoint: mountpoint.clone(),
        dev: 0,
        thread: Some(thread),
        ended,
    };
    // The first stat is served by the session thread: once it answers, the
    // mount is live.
    match std::fs::metadata(&mountpoint) {
        Ok(md) => {
            mounted.dev = md.dev();
            raise_readahead(md.dev());
        }
        Err(e) => warn!(error = %e, "cannot stat the new mount"),
    }
    info!(mountpoint = %mountpoint.display(), "mounted");
    Ok(mounted)
}

pub(crate) fn raise_readahead(dev: u64) {
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    match std::fs::write(&path, READ_AHEAD_KB.to_string()) {
        Ok(()) => debug!(path, kb = READ_AHEAD_KB, "readahead raised"),
        Err(e) => info!(path, error = %e, "could not raise readahead (best effort)"),
    }
}

fn umount2(path: &Path, flags: i32) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (`lazy`: detaches) directly as root, else via `fusermount3`.
    fn umount(&self, lazy: bool) -> std::io::Result<()> {
        if self.via_fusermount {
            fusermount::unmount(&self.mountpoint, lazy)
        } else {
            umount2(&self.mountpoint, if lazy { libc::MNT_DETACH } else { 0 })
        }
    }

    /// Whether the session has ended (unmounted, possibly from outside).
    pub fn is_ended(&self) -> bool {
        *self.ended.lock()
    }

    /// Blocks until the session ends — e.g. after an external `umount`.
    pub fn wait_unmounted(&self) {
        let mut done = self.ended.lock();
        while !*done {
            done = self.ended.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Like [`Mounted::wait_unmounted`] with a limit; `true` if ended.
    pub fn wait_unmounted_timeout(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut done = self.ended.lock();
        while !*done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self
                .ended
                .cv
                .wait_timeout(done, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Unmounts and joins the session thread. A busy mount (open files, a
    /// cwd inside) is retried for ~2 s, then detached lazily; if the
    /// session still does not end, its connection is aborted so the thread
    /// can be joined.
    pub fn unmount(mut self) -> Result<(), FuseError> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<(), FuseError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        if !self.is_ended() {
            let deadline = Instant::now() + BUSY_RETRY;
            loop {
                match self.umount(false) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        if Instant::now() >= deadline {
                            warn!(mountpoint = %self.mountpoint.display(), "mount still busy; detaching lazily");
                            if let Err(e) = self.umount(true) {
                                warn!(error = %e, "lazy unmount failed");
                            }
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    // EINVAL: not mounted any more (external umount).
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
                    Err(e) => {
                        // Put the thread back so Drop can still clean up.
                        self.thread = Some(thread);
                        return Err(FuseError::Unmount {
                            path: self.mountpoint.clone(),
                            source: e,
                        });
                    }
                }
            }
            if !self.wait_unmounted_timeout(Duration::from_secs(1)) {
                // A lazily detached mount lives on while files are open;
                // abort the connection so the session can end.
                self.abort_connection();
            }
        }
        match thread.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                // Already logged by the session thread; the mount is gone.
                debug!(error = %e, "session ended with an error");
                Ok(())
            }
            Err(_) => Err(FuseError::SessionPanicked),
        }
    }

    fn abort_connection(&self) {
        let dir = Path::new("/sys/fs/fuse/connections");
        let abort = dir.join(libc::minor(self.dev).to_string()).join("abort");
        if !abort.exists() {
            // fusectl may not be mounted (FUSER-NOTES); best effort.
            mount_fusectl(dir);
        }
        match std::fs::write(&abort, "1") {
            Ok(()) => info!(path = %abort.display(), "aborted FUSE connection"),
            Err(e) => warn!(path = %abort.display(), error = %e, "could not abort FUSE connection"),
        }
    }
}

fn mount_fusectl(dir: &Path) {
    let (Ok(target), Ok(fstype)) = (
        CString::new(dir.as_os_str().as_bytes()),
        CString::new("fusectl"),
    ) else {
        return;
    };
    // SAFETY: all pointers are valid NUL-terminated strings (or null data)
    // for the duration of the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        debug!(error = %std::io::Error::last_os_error(), "mounting fusectl");
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.unmount_inner() {
                error!(error = %e, "unmount on drop failed; detaching");
                let _ = self.umount(true);
            }
        }
    }
}
