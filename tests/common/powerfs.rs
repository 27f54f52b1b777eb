//! `PowerFs`: a FUSE pass-through layer for power-loss tests. It serves a
//! backing directory unchanged, and beside it keeps the *durable image*:
//! what a disk would still hold if the power were cut now. [`PowerFs::cut`]
//! ends the session for the program under test (every later operation fails
//! with `EIO`) and rewrites the backing directory to that image.
//!
//! The model is the strict reading of what Linux promises, not what one
//! filesystem happens to do:
//! - a file's content is durable as of its last `fsync`/`fdatasync`
//!   (FUSE_FSYNC; both persist the data and the size). Writes and
//!   truncations after it are lost. A file never synced is empty;
//! - a directory's entries (creates, renames in or out, unlinks, mkdir,
//!   rmdir) are durable as of its last `fsync` (FUSE_FSYNCDIR). A new file's
//!   name needs its directory fsynced; fsyncing the file does not make its
//!   name durable. A rename is durable at its target when the target
//!   directory is fsynced, and its source name is gone only once the source
//!   directory is fsynced (until then the image holds both names, with the
//!   file's durable content: the most that survives);
//! - `syncfs`/`sync` reach a FUSE filesystem as nothing (the kernel forwards
//!   them only to virtiofs), so they make nothing durable here: exactly the
//!   situation of a FUSE-backed state folder.
//!
//! The image starts as whatever the backing directory holds at mount (all
//! of it durable). Hard links, symlinks, special files and xattrs are not
//! supported (stagefs's state folder uses none). Inodes are the layer's own
//! and are never reused; a file unlinked while open stays readable and
//! syncable through its handle.
//!
//! One session thread, one lock: every operation is atomic with respect to
//! the cut, so no operation that returned success is missing from the model.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session,
    SessionACL, TimeOrNow, WriteFlags,
};

const ROOT: u64 = 1;
const TTL: Duration = Duration::ZERO;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
}

struct Node {
    kind: Kind,
    /// Where it is now: (parent, name); `None` once unlinked or replaced.
    live: Option<(u64, OsString)>,
    /// Directories: entries now, and as of the last fsync of the directory.
    entries: BTreeMap<OsString, u64>,
    durable_entries: BTreeMap<OsString, u64>,
    /// Files: content as of the last fsync/fdatasync.
    durable_content: Vec<u8>,
}

enum Handle {
    File { ino: u64, file: File },
    Dir,
}

/// Counts of what the program under test did, for the test's report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub writes: u64,
    pub fsyncs: u64,
    pub dir_fsyncs: u64,
    pub renames: u64,
}

struct Model {
    backing: PathBuf,
    cut: bool,
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    counts: Counts,
}

/// What survives a cut, by name.
enum Image {
    File(Vec<u8>),
    Dir(BTreeMap<OsString, Image>),
}

type OpResult<T> = Result<T, Errno>;

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Model {
    fn new(backing: &Path) -> std::io::Result<Model> {
        let mut m = Model {
            backing: backing.to_owned(),
            cut: false,
            nodes: HashMap::new(),
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            counts: Counts::default(),
        };
        m.nodes.insert(ROOT, Node::dir(None));
        m.scan(ROOT, backing)?;
        Ok(m)
    }

    /// Takes the backing tree as it is, all of it durable.
    fn scan(&mut self, dir_ino: u64, dir: &Path) -> std::io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let path = entry.path();
            let ino = self.next_ino;
            self.next_ino += 1;
            let ft = entry.file_type()?;
            let node = if ft.is_dir() {
                Node::dir(Some((dir_ino, name.clone())))
            } else if ft.is_file() {
                let mut n = Node::file(Some((dir_ino, name.clone())));
                n.durable_content = fs::read(&path)?;
                n
            } else {
                return Err(std::io::Error::other(format!(
                    "powerfs supports files and directories only: {}",
                    path.display()
                )));
            };
            self.nodes.insert(ino, node);
            let parent = self.nodes.get_mut(&dir_ino).expect("scanned parent");
            parent.entries.insert(name.clone(), ino);
            parent.durable_entries.insert(name, ino);
            if ft.is_dir() {
                self.scan(ino, &path)?;
            }
        }
        Ok(())
    }

    fn check(&self) -> OpResult<()> {
        if self.cut {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    fn node(&self, ino: u64) -> OpResult<&Node> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> OpResult<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// The backing path of a linked inode.
    fn path(&self, ino: u64) -> OpResult<PathBuf> {
        let mut names = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let (parent, name) = self.node(at)?.live.clone().ok_or(Errno::ENOENT)?;
            names.push(name);
            at = parent;
        }
        let mut p = self.backing.clone();
        for n in names.iter().rev() {
            p.push(n);
        }
        Ok(p)
    }

    fn child(&self, parent: u64, name: &OsStr) -> OpResult<u64> {
        let p = self.node(parent)?;
        if p.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        p.entries.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64, fh: Option<u64>) -> OpResult<FileAttr> {
        let via_handle = fh
            .and_then(|fh| match self.handles.get(&fh) {
                Some(Handle::File { file, .. }) => Some(file),
                _ => None,
            })
            .or_else(|| {
                // An unlinked file is still reachable through an open handle.
                self.handles.values().find_map(|h| match h {
                    Handle::File { ino: i, file } if *i == ino => Some(file),
                    _ => None,
                })
            });
        let meta = match (self.path(ino), via_handle) {
            (Ok(p), _) => fs::symlink_metadata(p).map_err(io_errno)?,
            (Err(_), Some(f)) => f.metadata().map_err(io_errno)?,
            (Err(e), None) => return Err(e),
        };
        let kind = match self.node(ino)?.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
        };
        Ok(super::fuse_attr::attr_of(ino, &meta, kind))
    }

    fn add_node(&mut self, parent: u64, name: &OsStr, node: Node) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, node);
        if let Some(p) = self.nodes.get_mut(&parent) {
            if let Some(old) = p.entries.insert(name.to_owned(), ino) {
                self.unlinked(old);
            }
        }
        ino
    }

    fn unlinked(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.live = None;
        }
    }

    fn open_handle(&mut self, handle: Handle) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, handle);
        fh
    }

    fn file(&self, fh: u64) -> OpResult<&File> {
        match self.handles.get(&fh) {
            Some(Handle::File { file, .. }) => Ok(file),
            _ => Err(Errno::EBADF),
        }
    }

    fn image_of(&self, ino: u64) -> Image {
        let Some(n) = self.nodes.get(&ino) else {
            return Image::File(Vec::new());
        };
        match n.kind {
            Kind::File => Image::File(n.durable_content.clone()),
            Kind::Dir => Image::Dir(
                n.durable_entries
                    .iter()
                    .map(|(name, child)| (name.clone(), self.image_of(*child)))
                    .collect(),
            ),
        }
    }
}

impl Node {
    fn dir(live: Option<(u64, OsString)>) -> Node {
        Node {
            kind: Kind::Dir,
            live,
            entries: BTreeMap::new(),
            durable_entries: BTreeMap::new(),
            durable_content: Vec::new(),
        }
    }

    fn file(live: Option<(u64, OsString)>) -> Node {
        Node {
            kind: Kind::File,
            ..Node::dir(live)
        }
    }
}

/// The filesystem handed to fuser.
struct Layer {
    model: Arc<Mutex<Model>>,
}

impl Layer {
    fn lock(&self) -> OpResult<MutexGuard<'_, Model>> {
        let m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        m.check()?;
        Ok(m)
    }
}

/// Replies to an operation that returns nothing but success or an errno.
fn answer(reply: ReplyEmpty, r: OpResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn read_all(file: &File) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len() as usize;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

impl Filesystem for Layer {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.lock().and_then(|m| {
            let ino = m.child(parent.0, name)?;
            m.attr(ino, None)
        });
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().and_then(|m| m.attr(ino.0, fh.map(|f| f.0))) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self.lock().and_then(|m| {
            if let Some(size) = size {
                match fh.map(|f| m.file(f.0)) {
                    Some(file) => file?.set_len(size).map_err(io_errno)?,
                    None => OpenOptions::new()
                        .write(true)
                        .open(m.path(ino.0)?)
                        .and_then(|f| f.set_len(size))
                        .map_err(io_errno)?,
                }
            }
            if let Some(mode) = mode {
                fs::set_permissions(m.path(ino.0)?, fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(io_errno)?;
            }
            m.attr(ino.0, fh.map(|f| f.0))
        });
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.lock().and_then(|mut m| {
            let path = m.path(parent.0)?.join(name);
            fs::create_dir(&path).map_err(io_errno)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & !umask & 0o7777))
                .map_err(io_errno)?;
            let ino = m.add_node(parent.0, name, Node::dir(Some((parent.0, name.to_owned()))));
            m.attr(ino, None)
        });
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.lock().and_then(|mut m| {
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EINVAL);
            }
            let ino = m.child(parent.0, name)?;
            let from = m.path(parent.0)?.join(name);
            let to = m.path(newparent.0)?.join(newname);
            let (cf, ct) = (cstr(&from)?, cstr(&to)?);
            // SAFETY: valid NUL-terminated paths.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    cf.as_ptr(),
                    libc::AT_FDCWD,
                    ct.as_ptr(),
                    flags.bits(),
                )
            };
            if rc != 0 {
                return Err(io_errno(std::io::Error::last_os_error()));
            }
            m.node_mut(parent.0)?.entries.remove(name);
            let replaced = m
                .node_mut(newparent.0)?
                .entries
                .insert(newname.to_owned(), ino);
            if let Some(old) = replaced.filter(|old| *old != ino) {
                m.unlinked(old);
            }
            m.node_mut(ino)?.live = Some((newparent.0, newname.to_owned()));
            m.counts.renames += 1;
            Ok(())
        });
        answer(reply, r)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = self.lock().and_then(|mut m| {
            if m.node(ino.0)?.kind != Kind::File {
                return Err(Errno::EISDIR);
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.path(ino.0)?)
                .map_err(io_errno)?;
            if flags.0 & libc::O_TRUNC != 0 {
                file.set_len(0).map_err(io_errno)?;
            }
            Ok(m.open_handle(Handle::File { ino: ino.0, file }))
        });
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.lock().and_then(|mut m| {
            let path = m.path(parent.0)?.join(name);
            let existing = m.child(parent.0, name).ok();
            let mut opts = OpenOptions::new();
            opts.read(true)
                .write(true)
                .mode(mode & !umask & 0o7777)
                .truncate(flags & libc::O_TRUNC != 0);
            if flags & libc::O_EXCL != 0 {
                opts.create_new(true);
            } else {
                opts.create(true);
            }
            let file = opts.open(&path).map_err(io_errno)?;
            let ino = match existing {
                Some(ino) => ino,
                None => m.add_node(
                    parent.0,
                    name,
                    Node::file(Some((parent.0, name.to_owned()))),
                ),
            };
            let fh = m.open_handle(Handle::File { ino, file });
            Ok((m.attr(ino, Some(fh))?, fh))
        });
        match r {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.lock().and_then(|m| {
            let file = m.file(fh.0)?;
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match file.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_errno(e)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        match r {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.lock().and_then(|mut m| {
            m.file(fh.0)?.write_all_at(data, offset).map_err(io_errno)?;
            m.counts.writes += 1;
            Ok(())
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        answer(reply, self.lock().map(drop))
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
        self.close(fh);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.lock().and_then(|mut m| {
            let content = read_all(m.file(fh.0)?).map_err(io_errno)?;
            m.node_mut(ino.0)?.durable_content = content;
            m.counts.fsyncs += 1;
            Ok(())
        });
        answer(reply, r)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self.lock().and_then(|mut m| {
            if m.node(ino.0)?.kind != Kind::Dir {
                return Err(Errno::ENOTDIR);
            }
            Ok(m.open_handle(Handle::Dir))
        });
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        let r = self.lock().and_then(|m| {
            let node = m.node(ino.0)?;
            let parent = node.live.as_ref().map_or(ROOT, |(p, _)| *p);
            let mut list = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (parent, FileType::Directory, OsString::from("..")),
            ];
            for (name, child) in &node.entries {
                let kind = match m.node(*child)?.kind {
                    Kind::Dir => FileType::Directory,
                    Kind::File => FileType::RegularFile,
                };
                list.push((*child, kind, name.clone()));
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
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.close(fh);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.lock().and_then(|mut m| {
            let node = m.node_mut(ino.0)?;
            node.durable_entries = node.entries.clone();
            m.counts.dir_fsyncs += 1;
            Ok(())
        });
        answer(reply, r)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let r = self.lock().and_then(|m| {
            let c = cstr(&m.backing)?;
            // SAFETY: a valid path and an out-parameter of the right type.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
                return Err(io_errno(std::io::Error::last_os_error()));
            }
            Ok(st)
        });
        match r {
            Ok(st) => reply.statfs(
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_files,
                st.f_ffree,
                st.f_bsize as u32,
                st.f_namemax as u32,
                st.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        answer(reply, self.lock().map(drop))
    }
}

impl Layer {
    /// Forgets a handle. Closing changes nothing durable, so it is allowed
    /// even after the cut.
    fn close(&self, fh: FileHandle) {
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        m.handles.remove(&fh.0);
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let r = self.lock().and_then(|mut m| {
            let ino = m.child(parent.0, name)?;
            let path = m.path(parent.0)?.join(name);
            if dir {
                fs::remove_dir(&path)
            } else {
                fs::remove_file(&path)
            }
            .map_err(io_errno)?;
            m.node_mut(parent.0)?.entries.remove(name);
            m.unlinked(ino);
            Ok(())
        });
        answer(reply, r)
    }
}

/// `umount2(MNT_DETACH)`, ignoring errors: the fallback when unmounting fails.
fn detach(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

fn cstr(p: &Path) -> OpResult<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// A mounted layer. Unmounts on drop (even when the test panics).
pub struct PowerFs {
    model: Arc<Mutex<Model>>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl PowerFs {
    /// Serves `backing` at `mountpoint` (an empty directory); everything in
    /// `backing` counts as durable.
    pub fn mount(backing: &Path, mountpoint: &Path) -> std::io::Result<PowerFs> {
        let model = Arc::new(Mutex::new(Model::new(backing)?));
        let mut cfg = Config::default();
        cfg.mount_options = vec![
            MountOption::FSName("powerfs".into()),
            MountOption::Subtype("powerfs".into()),
        ];
        cfg.acl = SessionACL::Owner;
        let layer = Layer {
            model: Arc::clone(&model),
        };
        let session = Session::new(layer, mountpoint, &cfg)?.spawn()?;
        Ok(PowerFs {
            model,
            session: Some(session),
            mountpoint: mountpoint.to_owned(),
        })
    }

    pub fn counts(&self) -> Counts {
        self.model.lock().unwrap_or_else(|p| p.into_inner()).counts
    }

    /// Cuts the power: from now on every operation fails with `EIO`, and
    /// the durable image is taken. The program under test should be killed
    /// next; [`PowerFs::restore`] then unmounts and rewrites the backing
    /// directory to the image.
    pub fn cut(&self) -> DurableImage {
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        m.cut = true;
        DurableImage(m.image_of(ROOT))
    }

    /// Unmounts, then makes the backing directory hold exactly `image`.
    pub fn restore(mut self, image: DurableImage) -> std::io::Result<()> {
        self.unmount();
        let backing = self
            .model
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .backing
            .clone();
        for entry in fs::read_dir(&backing)? {
            let p = entry?.path();
            if p.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
        let Image::Dir(entries) = image.0 else {
            return Err(std::io::Error::other("the image root is not a directory"));
        };
        write_image(&backing, &entries)
    }

    fn unmount(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                detach(&self.mountpoint);
            }
        }
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// What a cut leaves: see the module docs.
pub struct DurableImage(Image);

fn write_image(dir: &Path, entries: &BTreeMap<OsString, Image>) -> std::io::Result<()> {
    for (name, img) in entries {
        let p = dir.join(name);
        match img {
            Image::File(bytes) => fs::write(&p, bytes)?,
            Image::Dir(children) => {
                fs::create_dir(&p)?;
                write_image(&p, children)?;
            }
        }
    }
    Ok(())
}
