//! The `FileAttr` a pass-through test filesystem (`powerfs`, `gatefs`)
//! answers for a backing file: its size, times, mode and owner, under the
//! layer's own inode number.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

/// `meta`'s attributes as inode `ino` of kind `kind`.
pub fn attr_of(ino: u64, meta: &Metadata, kind: FileType) -> FileAttr {
    let time = |s: i64, ns: i64| {
        UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
    };
    FileAttr {
        ino: INodeNo(ino),
        size: meta.len(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
