//! Opening a file that an event names, beneath the root it must stay under
//! (the source root or the change-management root), without ever following
//! a path out of that root and without ever opening anything but a regular
//! file (issue 13 item 7). The daemon often runs as root, and the source tree
//! belongs to someone else: a symlink there must not make stagefs read
//! `/etc/shadow`, and a FIFO or device node must not hang a fetch or run a
//! driver's `open`.
//!
//! [`open_beneath`] resolves `relative` under `root` with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: `..` and symlinks are followed
//! only while they stay beneath `root` (a symlink inside the tree that points
//! elsewhere inside it is fine; one that points out is refused), and
//! `/proc/<pid>/fd`-style magic links never are. The final component is first
//! opened `O_PATH` (no read access, no driver `open`, no FIFO wait), checked
//! with `fstat` to be a regular file, and only then reopened for reading
//! through that very descriptor (`/proc/self/fd/N`), so what is read is the
//! inode that was checked. Where `/proc` is not mounted, the path is resolved
//! a second time with the read flags (`O_NONBLOCK`, so a FIFO swapped in
//! between still cannot block) and must be the same inode as the one checked.
//! The returned file is blocking (the reopen through `/proc` names the
//! inode already checked to be a regular file, so it is opened without
//! `O_NONBLOCK`; the second resolution clears it). [`LocalFile`]
//! also keeps the identity that check read, so a caller needs no `fstat`
//! of its own before copying.
//!
//! Kernels without `openat2` (before 5.6, `ENOSYS`) get a component walk:
//! every directory opened `O_PATH | O_DIRECTORY | O_NOFOLLOW` relative to the
//! previous one. That walk follows no symlink at all (it cannot tell where a
//! link leads without resolving it itself), so there an in-root symlink is
//! refused too; the reason says so.
//!
//! `root` itself is the operator's flag and is trusted as given (it may be a
//! symlink). [`LocalFile`] is the [`SourceFile`] the store reads: the file
//! opened this way, with the identity that check read.

use std::ffi::CString;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path};

use super::{DirTree, Identity, SourceFile, SourceOpenError, Stamp, TreeEntry};

/// Flags the file is finally read with. `O_NONBLOCK` only matters for a
/// non-regular file swapped in after the check (see the module docs).
const READ_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// Flags of the reopen through `/proc/self/fd`: that names the very inode
/// already checked to be a regular file, so no `O_NONBLOCK` is needed
/// (and none has to be cleared after).
const PROC_READ_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NOCTTY | libc::O_CLOEXEC;
/// Flags of the checking open: no access to the data, no driver `open`.
/// `openat2` may follow a last-component symlink (beneath the root only).
const PATH_FLAGS: libc::c_int = libc::O_PATH | libc::O_CLOEXEC;

/// Opens `root/relative` for reading if it is a regular file reached without
/// leaving `root`. `relative` must be relative; an absolute one is refused
/// as [`SourceOpenError::Escapes`].
pub fn open_beneath(root: &Path, relative: &Path) -> Result<File, SourceOpenError> {
    open_beneath_stat(root, relative).map(|(file, _)| file)
}

/// [`open_beneath`], also returning the `fstat` of the inode checked (the
/// inode returned), so the caller needs no `fstat` of its own before
/// reading.
fn open_beneath_stat(root: &Path, relative: &Path) -> Result<(File, libc::stat), SourceOpenError> {
    let dir = open_root(root)?;
    let checked = match openat2_beneath(&dir, relative, PATH_FLAGS) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => walk_beneath(&dir, relative)?,
        other => other.map_err(classify)?,
    };
    let st = fstat(&checked).map_err(SourceOpenError::Io)?;
    check_regular(&st)?;
    match reopen_through_proc(&checked) {
        // Opened without O_NONBLOCK: nothing to clear.
        Ok(f) => Ok((f, st)),
        // No /proc: resolve again, then make sure it is the inode checked.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            let again = match openat2_beneath(&dir, relative, READ_FLAGS) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    let parent_and_name = walk_parent(&dir, relative)?;
                    openat(
                        &parent_and_name.0,
                        &parent_and_name.1,
                        READ_FLAGS | libc::O_NOFOLLOW,
                    )
                    .map_err(classify)?
                }
                other => other.map_err(classify)?,
            };
            let now = fstat(&again).map_err(SourceOpenError::Io)?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
                check_regular(&now)?;
                return Err(SourceOpenError::Io(io::Error::other(
                    "the file was replaced while being opened",
                )));
            }
            let file = File::from(again);
            clear_nonblock(&file).map_err(SourceOpenError::Io)?;
            Ok((file, now))
        }
        Err(e) => Err(classify(e)),
    }
}

/// A regular file opened beneath its root ([`open_beneath`]), with the
/// identity the check read from that very inode.
#[derive(Debug)]
pub struct LocalFile {
    file: File,
    identity: Identity,
}

impl LocalFile {
    /// Opens `root/relative` as [`open_beneath`] does.
    pub fn open(root: &Path, relative: &Path) -> Result<LocalFile, SourceOpenError> {
        let (file, st) = open_beneath_stat(root, relative)?;
        Ok(LocalFile {
            file,
            identity: identity_of_stat(&st),
        })
    }
}

impl SourceFile for LocalFile {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn identity_now(&self) -> io::Result<Identity> {
        self.file.metadata().map(|m| identity_of(&m))
    }

    fn local_file(&self) -> Option<&File> {
        Some(&self.file)
    }
}

/// The identity of a local file from its metadata (`stat`).
pub fn identity_of(m: &Metadata) -> Identity {
    Identity {
        size: m.len(),
        mtime_ns: nanos(m.mtime(), m.mtime_nsec()),
        stamp: Stamp::Local {
            ctime_ns: nanos(m.ctime(), m.ctime_nsec()),
            ino: m.ino(),
        },
    }
}

/// [`identity_of`] from a raw `fstat`, read with the same arithmetic.
#[allow(clippy::unnecessary_cast)]
fn identity_of_stat(st: &libc::stat) -> Identity {
    Identity {
        size: u64::try_from(st.st_size).unwrap_or(0),
        mtime_ns: nanos(st.st_mtime as i64, st.st_mtime_nsec as i64),
        stamp: Stamp::Local {
            ctime_ns: nanos(st.st_ctime as i64, st.st_ctime_nsec as i64),
            ino: st.st_ino as u64,
        },
    }
}

/// Seconds and nanoseconds as ns since the epoch.
fn nanos(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000) + nsec
}

fn open_root(root: &Path) -> Result<OwnedFd, SourceOpenError> {
    let c = cstring(root.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    owned(fd).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SourceOpenError::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!("the root {} does not exist", root.display()),
        )),
        _ => SourceOpenError::Io(e),
    })
}

/// `openat2(dir, relative, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
fn openat2_beneath(dir: &OwnedFd, relative: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = CString::new(relative.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `open_how` is plain integers; all-zero is its empty value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: valid descriptor, NUL-terminated path and an `open_how`
        // of the size passed; the result is checked.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        match owned(rc as RawFd) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // EAGAIN: a rename raced the lookup (RESOLVE_BENEATH retries
            // are the caller's job).
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            other => return other,
        }
    }
}

/// The `ENOSYS` fallback: walks `relative` one component at a time, every
/// directory opened without following a symlink; the last component is
/// opened `O_PATH | O_NOFOLLOW` (a symlink there is then caught by `fstat`).
fn walk_beneath(dir: &OwnedFd, relative: &Path) -> Result<OwnedFd, SourceOpenError> {
    let (parent, name) = walk_parent(dir, relative)?;
    let fd = openat(&parent, &name, PATH_FLAGS | libc::O_NOFOLLOW).map_err(classify)?;
    if fstat(&fd).map_err(SourceOpenError::Io)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(SourceOpenError::Symlink(
            "this kernel has no openat2, so no symlink is followed",
        ));
    }
    Ok(fd)
}

/// Opens every directory of `relative` but the last component, without
/// following symlinks; returns that directory and the last name.
fn walk_parent(dir: &OwnedFd, relative: &Path) -> Result<(OwnedFd, CString), SourceOpenError> {
    let mut names = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(n) => names.push(cstring(n.as_bytes())?),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(SourceOpenError::Escapes)
            }
        }
    }
    let Some(last) = names.pop() else {
        return Err(SourceOpenError::NotRegular("directory"));
    };
    let mut at = dup(dir).map_err(SourceOpenError::Io)?;
    for name in &names {
        at = match openat(
            &at,
            name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        ) {
            Ok(next) => next,
            // O_NOFOLLOW | O_DIRECTORY on a symlink is ENOTDIR: say which.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && is_symlink_at(&at, name) => {
                return Err(SourceOpenError::Symlink(
                    "this kernel has no openat2, so no symlink is followed",
                ))
            }
            Err(e) => return Err(classify(e)),
        };
    }
    Ok((at, last))
}

fn is_symlink_at(dir: &OwnedFd, name: &CString) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid descriptor, NUL-terminated name and a stat buffer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    // SAFETY: fstatat filled the buffer when it returned 0.
    rc == 0 && unsafe { st.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Reopens the inode behind an `O_PATH` descriptor for reading. This
/// `/proc` link is our own descriptor, not something the source named.
fn reopen_through_proc(fd: &OwnedFd) -> io::Result<File> {
    let c = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let new = unsafe { libc::open(c.as_ptr(), PROC_READ_FLAGS) };
    owned(new).map(File::from)
}

fn check_regular(st: &libc::stat) -> Result<(), SourceOpenError> {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => return Ok(()),
        libc::S_IFDIR => "directory",
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        // Only reachable through the walk's O_NOFOLLOW open.
        libc::S_IFLNK => return Err(SourceOpenError::Symlink("the file itself is a symlink")),
        _ => "special file",
    };
    Err(SourceOpenError::NotRegular(kind))
}

/// Maps an open error to its reason.
fn classify(e: io::Error) -> SourceOpenError {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => SourceOpenError::Missing,
        // EXDEV: RESOLVE_BENEATH saw the walk leave the root.
        Some(libc::EXDEV) => SourceOpenError::Escapes,
        // ELOOP: a magic link, or too many symlinks.
        Some(libc::ELOOP) => SourceOpenError::Symlink("a magic link or a symlink loop"),
        Some(libc::EACCES) | Some(libc::EPERM) => SourceOpenError::NotReadable(e),
        _ => SourceOpenError::Io(e),
    }
}

fn openat(dir: &OwnedFd, name: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: valid descriptor and NUL-terminated name; the result is checked.
    owned(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) })
}

fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
    fd.try_clone()
}

fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid descriptor and a stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so the buffer is filled.
    Ok(unsafe { st.assume_init() })
}

fn clear_nonblock(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a valid descriptor.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn owned(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned to us, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstring(bytes: &[u8]) -> Result<CString, SourceOpenError> {
    CString::new(bytes)
        .map_err(|e| SourceOpenError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)))
}

/// The local directory `dir` and everything below it ([`DirTree`]); None
/// when it does not exist. Symbolic links and special files are left out
/// (the store never reads through them). Each directory's modification
/// time is read after its entries, so a change made while listing shows.
pub fn list_tree(dir: &Path) -> Result<Option<DirTree>, String> {
    let mut entries = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        let listing = match std::fs::read_dir(&d) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound && rel.is_empty() => return Ok(None),
            Err(e) => return Err(format!("listing {}: {e}", d.display())),
        };
        for entry in listing {
            let entry = entry.map_err(|e| format!("listing {}: {e}", d.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(format!("{}: a file name that is not UTF-8", d.display()));
            };
            let child = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            let meta = match std::fs::symlink_metadata(entry.path()) {
                Ok(m) => m,
                Err(e) => return Err(format!("{}: {e}", entry.path().display())),
            };
            if meta.is_dir() {
                stack.push((entry.path(), child));
            } else if meta.is_file() {
                entries.push(TreeEntry {
                    rel: child,
                    is_dir: false,
                    size: meta.len(),
                    mtime_ms: identity_of(&meta).mtime_ns.div_euclid(1_000_000),
                });
            }
        }
        // After the entries: a change made while they were read shows.
        let meta = std::fs::symlink_metadata(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", d.display()));
        }
        let mtime_ms = identity_of(&meta).mtime_ns.div_euclid(1_000_000);
        // The listed directory's own time is read last of all, below.
        if !rel.is_empty() {
            entries.push(TreeEntry {
                rel,
                is_dir: true,
                size: 0,
                mtime_ms,
            });
        }
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Some(DirTree {
        mtime_ms: identity_of(&meta).mtime_ns.div_euclid(1_000_000),
        entries,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    fn mkfifo(path: &Path) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    fn read(f: Result<File, SourceOpenError>) -> String {
        let mut s = String::new();
        f.unwrap().read_to_string(&mut s).unwrap();
        s
    }

    struct Tree {
        _dir: tempfile::TempDir,
        root: std::path::PathBuf,
        outside: std::path::PathBuf,
    }

    fn tree() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::write(root.join("d/e/f"), b"inside").unwrap();
        let outside = dir.path().join("secret");
        std::fs::write(&outside, b"secret").unwrap();
        Tree {
            _dir: dir,
            root,
            outside,
        }
    }

    #[test]
    fn regular_file_beneath_the_root_opens_blocking() {
        let t = tree();
        let f = open_beneath(&t.root, Path::new("d/e/f")).unwrap();
        // SAFETY: F_GETFL on a valid descriptor.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0, "O_NONBLOCK is cleared");
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
        assert_eq!(read(Ok(f)), "inside");
    }

    #[test]
    fn symlinked_file_pointing_out_of_the_root_is_refused() {
        let t = tree();
        symlink(&t.outside, t.root.join("d/link")).unwrap();
        symlink("/etc/passwd", t.root.join("d/passwd")).unwrap();
        for name in ["d/link", "d/passwd"] {
            let e = open_beneath(&t.root, Path::new(name)).unwrap_err();
            assert!(matches!(e, SourceOpenError::Escapes), "{name}: {e}");
        }
    }

    #[test]
    fn symlinked_directory_pointing_out_of_the_root_is_refused() {
        let t = tree();
        let out_dir = t.outside.parent().unwrap();
        symlink(out_dir, t.root.join("up")).unwrap();
        symlink("../../..", t.root.join("d/e/dotdot")).unwrap();
        for name in ["up/secret", "d/e/dotdot/secret"] {
            let e = open_beneath(&t.root, Path::new(name)).unwrap_err();
            assert!(matches!(e, SourceOpenError::Escapes), "{name}: {e}");
        }
    }

    #[test]
    fn symlink_that_stays_beneath_the_root_is_followed() {
        let t = tree();
        symlink("e/f", t.root.join("d/same")).unwrap();
        symlink("../d/e", t.root.join("d/alias")).unwrap();
        assert_eq!(read(open_beneath(&t.root, Path::new("d/same"))), "inside");
        assert_eq!(
            read(open_beneath(&t.root, Path::new("d/alias/f"))),
            "inside"
        );
    }

    #[test]
    fn absolute_or_dotdot_relative_path_is_refused() {
        let t = tree();
        for name in ["/etc/passwd", "../secret", "d/../../secret"] {
            let e = open_beneath(&t.root, Path::new(name)).unwrap_err();
            assert!(matches!(e, SourceOpenError::Escapes), "{name}: {e}");
        }
    }

    #[test]
    fn fifo_is_refused_without_waiting_for_a_writer() {
        let t = tree();
        mkfifo(&t.root.join("d/pipe"));
        // Without O_PATH/O_NONBLOCK this open would wait for a writer forever.
        let e = open_beneath(&t.root, Path::new("d/pipe")).unwrap_err();
        assert!(matches!(e, SourceOpenError::NotRegular("FIFO")), "{e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn device_node_is_refused_without_running_its_driver_open() {
        let t = tree();
        let dev = t.root.join("d/dev");
        let c = CString::new(dev.as_os_str().as_bytes()).unwrap();
        // Major 240 is reserved for local use: no driver, so a real open
        // fails with ENXIO (or EACCES on a nodev mount). Needs root.
        // SAFETY: a valid NUL-terminated path.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(240, 0)) };
        assert_eq!(rc, 0, "mknod: {}", io::Error::last_os_error());
        let plain = std::fs::File::open(&dev).unwrap_err().raw_os_error();
        assert!(
            matches!(plain, Some(libc::ENXIO | libc::EACCES)),
            "{plain:?}"
        );
        let e = open_beneath(&t.root, Path::new("d/dev")).unwrap_err();
        assert!(
            matches!(e, SourceOpenError::NotRegular("character device")),
            "{e}"
        );
    }

    #[test]
    fn directory_and_missing_paths_have_their_reasons() {
        let t = tree();
        let e = open_beneath(&t.root, Path::new("d/e")).unwrap_err();
        assert!(matches!(e, SourceOpenError::NotRegular("directory")), "{e}");
        for name in ["d/nope", "d/e/f/under-a-file"] {
            let e = open_beneath(&t.root, Path::new(name)).unwrap_err();
            assert!(matches!(e, SourceOpenError::Missing), "{name}: {e}");
        }
    }

    #[test]
    fn fallback_walk_opens_files_and_follows_no_symlink() {
        let t = tree();
        let dir = open_root(&t.root).unwrap();
        let fd = walk_beneath(&dir, Path::new("d/e/f")).unwrap();
        check_regular(&fstat(&fd).unwrap()).unwrap();
        symlink(&t.outside, t.root.join("d/link")).unwrap();
        symlink("e", t.root.join("d/alias")).unwrap();
        for name in ["d/link", "d/alias/f"] {
            let e = walk_beneath(&dir, Path::new(name)).unwrap_err();
            assert!(matches!(e, SourceOpenError::Symlink(_)), "{name}: {e}");
        }
        let e = walk_beneath(&dir, Path::new("d/../../secret")).unwrap_err();
        assert!(matches!(e, SourceOpenError::Escapes), "{e}");
        mkfifo(&t.root.join("d/pipe"));
        let fd = walk_beneath(&dir, Path::new("d/pipe")).unwrap();
        assert!(matches!(
            check_regular(&fstat(&fd).unwrap()),
            Err(SourceOpenError::NotRegular("FIFO"))
        ));
    }
}
