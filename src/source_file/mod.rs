//! Reading a file that an event names, where the source keeps it.
//!
//! [`Location`] says where a file is; [`Location::open`] opens it as a
//! [`SourceFile`], the one small trait the store reads through: the file's
//! [`Identity`] as opened and as it is now (a file that changed while it
//! was read is not a usable copy), its bytes by offset, and, for a file on
//! a local filesystem, the open [`File`] itself, so the copy engines can
//! copy it inside the kernel (`copy_file_range`) and advise its readahead.
//!
//! One implementation per kind of place, each in its own file: [`local`]
//! (a path beneath a root directory, opened without ever leaving it and
//! only when it is a regular file), [`hdfs`] (a file on HDFS, read where
//! it is through the native client) and [`s3`] (an object on S3 or an
//! S3-compatible store, read as one version through `object_store`). A
//! reader of another kind of place is a new file beside them, a new
//! [`Location`] variant and its arm in [`Location::open_with`],
//! [`Location::remote`] and [`Location`]'s `Display`; nothing else changes.
//!
//! What reading a remote place needs beyond its URI (S3's endpoint,
//! region, credentials and clients) is a [`Remotes`], given by whoever
//! wires the pipeline; HDFS takes its settings from the Hadoop
//! configuration of the process.
//!
//! Called by the blob store's fetch (`stage`) and by the bootstrap
//! listing when it re-reads a file it staged before
//! (`bootstrap::listing`).

pub mod hdfs;
pub mod local;
mod parts;
pub mod s3;

use std::fmt;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use local::{identity_of, open_beneath, LocalFile};

/// Where a source file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// `relative` beneath the local directory `root`: opened only if it is
    /// a regular file reached without leaving `root` ([`local`]).
    Local { root: PathBuf, relative: PathBuf },
    /// A file on HDFS, by its URI (`hdfs://host:port/path` or
    /// `hdfs://nameservice/path`), checked well formed ([`hdfs`]).
    Hdfs { uri: String },
    /// An object on S3, by its URI (`s3a://bucket/key` or
    /// `s3://bucket/key`), checked well formed ([`s3`]).
    S3 { uri: String },
}

/// What reading remote places takes beyond their URIs: for S3, the
/// settings and clients of an [`s3::S3Access`] (when none is given, the
/// process's own AWS environment, read once).
#[derive(Debug, Clone, Default)]
pub struct Remotes {
    s3: Option<Arc<s3::S3Access>>,
}

impl Remotes {
    /// Reads S3 with `access`.
    pub fn with_s3(access: Arc<s3::S3Access>) -> Remotes {
        Remotes { s3: Some(access) }
    }

    /// The S3 access: the one given, else the process environment's.
    pub fn s3(&self) -> Arc<s3::S3Access> {
        match &self.s3 {
            Some(access) => Arc::clone(access),
            None => s3::S3Access::from_process_environment(),
        }
    }
}

impl Location {
    /// A path beneath a local root.
    pub fn local(root: impl Into<PathBuf>, relative: impl Into<PathBuf>) -> Location {
        Location::Local {
            root: root.into(),
            relative: relative.into(),
        }
    }

    /// The place a file URI names on a file system stagefs reads where it
    /// is (HDFS, S3); `None` for a URI of any other kind (a local path, a
    /// scheme with no reader), `Some(Err)` for a malformed one.
    pub fn remote(uri: &str) -> Option<Result<Location, String>> {
        if hdfs::HdfsUri::is_hdfs(uri) {
            return Some(hdfs::HdfsUri::parse(uri).map(|_| Location::Hdfs {
                uri: uri.to_owned(),
            }));
        }
        if s3::S3Uri::is_s3(uri) {
            return Some(s3::S3Uri::parse(uri).map(|_| Location::S3 {
                uri: uri.to_owned(),
            }));
        }
        None
    }

    /// Opens the file for reading (S3 with the process's AWS environment).
    pub fn open(&self) -> Result<Box<dyn SourceFile>, SourceOpenError> {
        self.open_with(&Remotes::default())
    }

    /// Opens the file for reading, a remote one with `remotes`.
    pub fn open_with(&self, remotes: &Remotes) -> Result<Box<dyn SourceFile>, SourceOpenError> {
        match self {
            Location::Local { root, relative } => {
                Ok(Box::new(local::LocalFile::open(root, relative)?))
            }
            Location::Hdfs { uri } => Ok(Box::new(hdfs::HdfsFile::open(uri)?)),
            Location::S3 { uri } => Ok(Box::new(s3::S3File::open(&remotes.s3(), uri)?)),
        }
    }
}

impl Location {
    /// The file as it was at `at_ms` (ms since the epoch), when the file
    /// as opened now is newer and the place keeps older versions
    /// (`keeps_versions`: the file opened now has a
    /// [`SourceFile::version`]): an S3 object in a bucket that gives
    /// version ids ([`s3::S3File::open_as_of`]). `None` where the place
    /// keeps no versions (a local file, HDFS, an unversioned bucket): the
    /// current file is all there is. `Some(Err)` says why no version of
    /// that moment can be read.
    pub fn open_as_of(
        &self,
        remotes: &Remotes,
        keeps_versions: bool,
        at_ms: i64,
    ) -> Option<Result<Box<dyn SourceFile>, String>> {
        match self {
            Location::S3 { .. } if !keeps_versions => None,
            Location::S3 { uri } => Some(
                s3::S3File::open_as_of(&remotes.s3(), uri, at_ms)
                    .map(|f| Box::new(f) as Box<dyn SourceFile>),
            ),
            Location::Local { .. } | Location::Hdfs { .. } => None,
        }
    }
}

/// The path (or URI) of the file, for messages.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local { root, relative } => write!(f, "{}", root.join(relative).display()),
            Location::Hdfs { uri } | Location::S3 { uri } => f.write_str(uri),
        }
    }
}

/// An open source file, as the store reads it.
pub trait SourceFile: Send {
    /// The file's identity when it was opened (for a local file, read from
    /// the very inode that is read).
    fn identity(&self) -> &Identity;

    /// Reads up to `buf.len()` bytes at `offset`; fewer only at the end of
    /// the file (0 there). Errors as `pread(2)`'s (`Interrupted` is for the
    /// caller to retry).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// The file's identity now, checked again through the file that was
    /// read (for a local file, `fstat` of its descriptor): differs from
    /// [`SourceFile::identity`] when the file changed meanwhile.
    fn identity_now(&self) -> io::Result<Identity>;

    /// The open file on a local filesystem, for the engines that copy
    /// inside the kernel; `None` where the file is not one.
    fn local_file(&self) -> Option<&File>;

    /// The S3 ETag (without quotes) of the object version read; `None`
    /// for a file that is not an S3 object.
    fn etag(&self) -> Option<&str> {
        None
    }

    /// The version id of the object version read, in an S3 bucket that
    /// keeps versions (`null` for an object written while versioning was
    /// suspended); `None` where the place keeps no versions.
    fn version(&self) -> Option<&str> {
        None
    }
}

/// What must be unchanged for bytes read from a file to stand for it: a
/// rewrite changes at least one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub size: u64,
    /// Last modification, in ns since the epoch.
    pub mtime_ns: i64,
    /// What else changes with a rewrite, by kind of place.
    pub stamp: Stamp,
}

/// The part of an [`Identity`] that depends on the kind of place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// A local file: its ctime (set by the kernel on every change of the
    /// inode, and not by tools that preserve mtimes) and its inode number
    /// (another one: the path was replaced).
    Local { ctime_ns: i64, ino: u64 },
    /// A file on HDFS: its block size (a rewrite may change it; length and
    /// modification time are in the [`Identity`]).
    Hdfs { block_size: u64 },
    /// An object on S3: a digest of its ETag (size and last-modified time
    /// are in the [`Identity`]; a read pins the version id itself).
    S3 { tag: [u8; 16] },
}

/// A directory and everything below it, as listed at one moment: what
/// tells whether its content changed since a time (a directory's
/// modification time moves with every create, delete and rename inside it
/// on HDFS and local file systems).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirTree {
    /// The directory's own modification time, in ms since the epoch, asked
    /// after its entries were listed (so a change made while listing shows).
    pub mtime_ms: i64,
    /// Every file and directory below it, in no particular order.
    pub entries: Vec<TreeEntry>,
}

/// One entry of a [`DirTree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// Its path below the listed directory (`000000_0`, `sub/000000_0`).
    pub rel: String,
    pub is_dir: bool,
    pub size: u64,
    /// Last modification in ms since the epoch; a directory's is asked
    /// after its own entries were listed, as for [`DirTree::mtime_ms`].
    pub mtime_ms: i64,
}

/// Why a source file could not be opened. The `Display` text is the reason
/// shown in a stall (after the path).
#[derive(Debug, thiserror::Error)]
pub enum SourceOpenError {
    #[error("missing")]
    Missing,
    #[error("refused: the path leaves its root (through a symlink or `..`)")]
    Escapes,
    #[error("refused: a symlink on the path (not followed: {0})")]
    Symlink(&'static str),
    #[error("not a regular file (a {0}); refused without opening it")]
    NotRegular(&'static str),
    #[error("not readable ({0})")]
    NotReadable(io::Error),
    #[error("cannot open: {0}")]
    Io(io::Error),
}
