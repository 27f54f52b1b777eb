//! `GateFs`: a read-only FUSE pass-through of a backing directory whose
//! reads of chosen files hang until the test lets them go — a source on a
//! hung NFS or FUSE server, for the fetch-timeout tests.
//!
//! [`GateFs::hold`] makes every later `read` of a file with that name wait
//! (the kernel request stays unanswered, so the reader is blocked in
//! `read(2)`); [`GateFs::release`] answers every waiting read and lets later
//! ones through. Files are opened with `FOPEN_DIRECT_IO`, so every read
//! reaches the layer (no page cache hides the hang or its end).
//!
//! A held read waits on its own thread, never in the session thread, so
//! the rest of the filesystem keeps answering. Dropping the layer releases
//! every read, then unmounts (lazily if it must), even when a test panics.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, Request, Session, SessionACL,
};

const ROOT: u64 = 1;
const TTL: Duration = Duration::ZERO;

#[derive(Default)]
struct Gate {
    held: HashSet<OsString>,
    /// Reads waiting for a release now.
    waiting: usize,
    /// Reads that ever waited.
    waited: u64,
}

struct Shared {
    gate: Mutex<Gate>,
    released: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Tables {
    /// Inode → path relative to the backing directory ("" for the root).
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next_ino: u64,
    files: HashMap<u64, Arc<File>>,
    next_fh: u64,
}

struct Layer {
    backing: PathBuf,
    tables: Mutex<Tables>,
    shared: Arc<Shared>,
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Layer {
    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rel(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.tables().paths.get(&ino).cloned().ok_or(Errno::ENOENT)
    }

    fn ino_of(&self, rel: &Path) -> u64 {
        let mut t = self.tables();
        if let Some(&ino) = t.inos.get(rel) {
            return ino;
        }
        let ino = t.next_ino;
        t.next_ino += 1;
        t.paths.insert(ino, rel.to_owned());
        t.inos.insert(rel.to_owned(), ino);
        ino
    }

    fn attr(&self, ino: u64, rel: &Path) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.backing.join(rel)).map_err(io_errno)?;
        let kind = if meta.is_dir() {
            FileType::Directory
        } else if meta.is_file() {
            FileType::RegularFile
        } else {
            return Err(Errno::EACCES);
        };
        Ok(super::fuse_attr::attr_of(ino, &meta, kind))
    }
}

impl Filesystem for Layer {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.rel(parent.0).and_then(|p| {
            let rel = p.join(name);
            let ino = self.ino_of(&rel);
            self.attr(ino, &rel)
        });
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.rel(ino.0).and_then(|rel| self.attr(ino.0, &rel)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let r = self.rel(ino.0).and_then(|rel| {
            let file = File::open(self.backing.join(rel)).map_err(io_errno)?;
            let mut t = self.tables();
            let fh = t.next_fh;
            t.next_fh += 1;
            t.files.insert(fh, Arc::new(file));
            Ok(fh)
        });
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.tables().files.get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let name = self
            .rel(ino.0)
            .ok()
            .and_then(|p| p.file_name().map(OsStr::to_owned));
        let shared = Arc::clone(&self.shared);
        let serve = move || {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return reply.error(io_errno(e)),
                }
            }
            reply.data(&buf[..got]);
        };
        let held = name.is_some_and(|n| self.shared.lock().held.contains(&n));
        if !held {
            return serve();
        }
        std::thread::spawn(move || {
            {
                let mut g = shared.lock();
                g.waiting += 1;
                g.waited += 1;
                // `release` empties the set: every held read goes at once.
                while !g.held.is_empty() {
                    g = shared.released.wait(g).unwrap_or_else(|p| p.into_inner());
                }
                g.waiting -= 1;
            }
            serve();
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.tables().files.remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.rel(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.rel(ino.0).and_then(|rel| {
            let mut list = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (ROOT, FileType::Directory, OsString::from("..")),
            ];
            let mut entries: Vec<_> = fs::read_dir(self.backing.join(&rel))
                .map_err(io_errno)?
                .filter_map(Result::ok)
                .collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let kind = match e.file_type() {
                    Ok(t) if t.is_dir() => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                let child = self.ino_of(&rel.join(e.file_name()));
                list.push((child, kind, e.file_name()));
            }
            Ok(list)
        });
        match r {
            Ok(list) => {
                for (i, (child, kind, name)) in list.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }
}

/// A mounted layer; see the module docs.
pub struct GateFs {
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl GateFs {
    /// Serves `backing` read-only at `mountpoint` (an empty directory).
    pub fn mount(backing: &Path, mountpoint: &Path) -> std::io::Result<GateFs> {
        let shared = Arc::new(Shared {
            gate: Mutex::new(Gate::default()),
            released: Condvar::new(),
        });
        let mut tables = Tables {
            paths: HashMap::new(),
            inos: HashMap::new(),
            next_ino: ROOT + 1,
            files: HashMap::new(),
            next_fh: 1,
        };
        tables.paths.insert(ROOT, PathBuf::new());
        tables.inos.insert(PathBuf::new(), ROOT);
        let layer = Layer {
            backing: backing.to_owned(),
            tables: Mutex::new(tables),
            shared: Arc::clone(&shared),
        };
        let mut cfg = Config::default();
        cfg.mount_options = vec![
            MountOption::FSName("gatefs".into()),
            MountOption::Subtype("gatefs".into()),
        ];
        cfg.acl = SessionACL::Owner;
        let session = Session::new(layer, mountpoint, &cfg)?.spawn()?;
        Ok(GateFs {
            shared,
            session: Some(session),
            mountpoint: mountpoint.to_owned(),
        })
    }

    /// Every later read of a file named `name` hangs until [`GateFs::release`].
    pub fn hold(&self, name: &str) {
        self.shared.lock().held.insert(OsString::from(name));
    }

    /// Answers every waiting read; later reads go through.
    pub fn release(&self) {
        self.shared.lock().held.clear();
        self.shared.released.notify_all();
    }

    /// Reads waiting now.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiting
    }

    /// Reads that ever waited.
    pub fn waited(&self) -> u64 {
        self.shared.lock().waited
    }
}

impl Drop for GateFs {
    fn drop(&mut self) {
        self.release();
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                if let Ok(c) = CString::new(self.mountpoint.as_os_str().as_bytes()) {
                    // SAFETY: a valid NUL-terminated path.
                    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                }
            }
        }
    }
}
