//! One directory of a published state (`catalogs/<sha256>`): its kind,
//! the state and time its content last changed, and its entries in name
//! order, a subdirectory by the content id of its own object, a file by
//! everything the mount shows of it.
//!
//! A state's tree is a Merkle tree of these objects: a directory that did
//! not change between two states is the same object, so a state costs the
//! objects of the directories its events changed (root → database → table
//! → partitions), never the warehouse; a reader fetches only the objects
//! it does not hold yet.
//!
//! ```text
//! "STGFSC01" | kind u8 | kind fields | state_id u64 | time_ms i64 | count u32 | entries
//! kind: 0 root, 1 database, 2 table (keys: u16 count, name each;
//!       not_in_log: u8 flag, str), 3 partition (depth u16), 4 subdir
//! entry: name | 0 dir: catalog id [32]
//!              | 1 file: state_id u64 | time_ms i64 | size u64 | sha256 [32]
//!                        | key: u8 flag [32] | pieces: u8 flag [32]
//!                        | verified: name | source: str
//! name: u16 length + UTF-8; str: u32 length + UTF-8; integers little-endian
//! ```
//!
//! The encoding is canonical (entries strictly in name order, no trailing
//! bytes, flags 0 or 1), so equal directories are equal objects. Objects
//! come from storage, which is not trusted: [`DirObject::decode`] checks
//! every length against what is left, every name, and a size limit.

use std::sync::Arc;

use crate::catalog::{DirKind, Name};
use crate::event::{is_valid_file_name, BlobId, StateId};

const MAGIC: &[u8; 8] = b"STGFSC01";

/// Larger catalog objects are refused unread (a partition of a few
/// million files fits).
pub const MAX_CATALOG_BYTES: u64 = 1 << 30;
/// The longest `source` a file entry may carry.
pub const MAX_SOURCE_BYTES: usize = 64 << 10;
/// Partition keys of a table, at most.
pub const MAX_PARTITION_KEYS: usize = crate::event::MAX_PARTITION_KEYS;

/// The `user.stagefs.verified` values a published file may carry.
const VERIFIED: [&str; 5] = [
    "sha256",
    "hdfs-md5md5crc32c",
    "s3-etag",
    "not-newer-than-event",
    "none",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirObject {
    pub kind: DirKind,
    pub state_id: StateId,
    pub time_ms: i64,
    /// Strictly increasing by name.
    pub entries: Vec<(Name, Entry)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A subdirectory: the content id of its object.
    Dir(BlobId),
    File(FileEntry),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub state_id: StateId,
    pub time_ms: i64,
    pub size: u64,
    pub sha256: BlobId,
    /// The reference key of a file known by content only once staged (Hive).
    pub key: Option<BlobId>,
    /// The piece list of a file larger than one piece.
    pub pieces: Option<BlobId>,
    pub verified: &'static str,
    pub source: Box<str>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CatalogObjectError {
    #[error("catalog object of {0} bytes, more than the limit")]
    TooLarge(u64),
    #[error("not a catalog object: {0}")]
    Malformed(String),
}

fn bad(m: impl Into<String>) -> CatalogObjectError {
    CatalogObjectError::Malformed(m.into())
}

/// `user.stagefs.verified` as a static label, when it is one we know.
pub fn verified_label(label: &str) -> Option<&'static str> {
    VERIFIED.iter().copied().find(|v| *v == label)
}

impl DirObject {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64 + self.entries.len() * 96);
        w.extend_from_slice(MAGIC);
        match &self.kind {
            DirKind::Root => w.push(0),
            DirKind::Database => w.push(1),
            DirKind::Table {
                partition_keys,
                not_in_log,
            } => {
                w.push(2);
                w.extend_from_slice(&(partition_keys.len() as u16).to_le_bytes());
                for k in partition_keys.iter() {
                    put_name(&mut w, k);
                }
                match not_in_log {
                    None => w.push(0),
                    Some(why) => {
                        w.push(1);
                        put_str(&mut w, why);
                    }
                }
            }
            DirKind::Partition { depth } => {
                w.push(3);
                w.extend_from_slice(&depth.to_le_bytes());
            }
            DirKind::Subdir => w.push(4),
        }
        w.extend_from_slice(&self.state_id.0.to_le_bytes());
        w.extend_from_slice(&self.time_ms.to_le_bytes());
        w.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (name, entry) in &self.entries {
            put_name(&mut w, name);
            match entry {
                Entry::Dir(id) => {
                    w.push(0);
                    w.extend_from_slice(&id.0);
                }
                Entry::File(f) => {
                    w.push(1);
                    w.extend_from_slice(&f.state_id.0.to_le_bytes());
                    w.extend_from_slice(&f.time_ms.to_le_bytes());
                    w.extend_from_slice(&f.size.to_le_bytes());
                    w.extend_from_slice(&f.sha256.0);
                    for opt in [&f.key, &f.pieces] {
                        match opt {
                            None => w.push(0),
                            Some(id) => {
                                w.push(1);
                                w.extend_from_slice(&id.0);
                            }
                        }
                    }
                    put_name(&mut w, f.verified);
                    put_str(&mut w, &f.source);
                }
            }
        }
        w
    }

    pub fn decode(bytes: &[u8]) -> Result<DirObject, CatalogObjectError> {
        if bytes.len() as u64 > MAX_CATALOG_BYTES {
            return Err(CatalogObjectError::TooLarge(bytes.len() as u64));
        }
        let mut r = Reader { b: bytes, pos: 0 };
        if r.take(8)? != MAGIC {
            return Err(bad("no STGFSC01 header"));
        }
        let kind = match r.u8()? {
            0 => DirKind::Root,
            1 => DirKind::Database,
            2 => {
                let n = usize::from(r.u16()?);
                if n > MAX_PARTITION_KEYS {
                    return Err(bad("too many partition keys"));
                }
                let mut keys: Vec<Name> = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = r.name()?;
                    if keys.iter().any(|e| **e == *k) {
                        return Err(bad("a partition key repeats"));
                    }
                    keys.push(k);
                }
                let not_in_log = match r.flag()? {
                    false => None,
                    true => Some(Arc::from(r.str(MAX_SOURCE_BYTES)?)),
                };
                DirKind::Table {
                    partition_keys: keys.into(),
                    not_in_log,
                }
            }
            3 => {
                let depth = r.u16()?;
                if depth == 0 || usize::from(depth) > MAX_PARTITION_KEYS {
                    return Err(bad("partition depth out of range"));
                }
                DirKind::Partition { depth }
            }
            4 => DirKind::Subdir,
            k => return Err(bad(format!("unknown directory kind {k}"))),
        };
        let state_id = StateId(r.u64()?);
        let time_ms = r.i64()?;
        let count = r.u32()? as usize;
        // The smallest entry is 36 bytes: never reserve more than the
        // object can hold.
        let mut entries: Vec<(Name, Entry)> = Vec::with_capacity(count.min(r.left() / 36));
        let files_allowed = !matches!(kind, DirKind::Root | DirKind::Database);
        for _ in 0..count {
            let name = r.name()?;
            if let Some((prev, _)) = entries.last() {
                if **prev >= *name {
                    return Err(bad("entries are not in strictly increasing name order"));
                }
            }
            let entry = match r.u8()? {
                0 => Entry::Dir(r.id()?),
                1 if files_allowed => {
                    let state_id = StateId(r.u64()?);
                    let time_ms = r.i64()?;
                    let size = r.u64()?;
                    let sha256 = r.id()?;
                    let key = r.flag()?.then(|| r.id()).transpose()?;
                    let pieces = r.flag()?.then(|| r.id()).transpose()?;
                    let label = r.name()?;
                    let verified = verified_label(&label)
                        .ok_or_else(|| bad(format!("unknown verification {label:?}")))?;
                    let source = r.str(MAX_SOURCE_BYTES)?.into();
                    Entry::File(FileEntry {
                        state_id,
                        time_ms,
                        size,
                        sha256,
                        key,
                        pieces,
                        verified,
                        source,
                    })
                }
                1 => return Err(bad("a file directly in the root or a database")),
                t => return Err(bad(format!("unknown entry type {t}"))),
            };
            entries.push((name, entry));
        }
        if r.left() != 0 {
            return Err(bad("bytes after the last entry"));
        }
        Ok(DirObject {
            kind,
            state_id,
            time_ms,
            entries,
        })
    }
}

fn put_name(w: &mut Vec<u8>, s: &str) {
    w.extend_from_slice(&(s.len() as u16).to_le_bytes());
    w.extend_from_slice(s.as_bytes());
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    w.extend_from_slice(&(s.len() as u32).to_le_bytes());
    w.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CatalogObjectError> {
        if n > self.left() {
            return Err(bad("truncated"));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CatalogObjectError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, CatalogObjectError> {
        Ok(self.take(1)?[0])
    }

    fn flag(&mut self) -> Result<bool, CatalogObjectError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            f => Err(bad(format!("flag {f} is neither 0 nor 1"))),
        }
    }

    fn u16(&mut self) -> Result<u16, CatalogObjectError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, CatalogObjectError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, CatalogObjectError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, CatalogObjectError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn id(&mut self) -> Result<BlobId, CatalogObjectError> {
        Ok(BlobId(self.array()?))
    }

    /// One path component (a directory or file name, a key, a label).
    fn name(&mut self) -> Result<Name, CatalogObjectError> {
        let n = usize::from(self.u16()?);
        let s = std::str::from_utf8(self.take(n)?).map_err(|_| bad("a name is not UTF-8"))?;
        if !is_valid_file_name(s) {
            return Err(bad(format!("invalid name {s:?}")));
        }
        Ok(Arc::from(s))
    }

    fn str(&mut self, max: usize) -> Result<&'a str, CatalogObjectError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(bad("a text field is too long"));
        }
        std::str::from_utf8(self.take(n)?).map_err(|_| bad("a text field is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> DirObject {
        DirObject {
            kind: DirKind::Table {
                partition_keys: vec![Arc::from("ds"), Arc::from("hr")].into(),
                not_in_log: Some(Arc::from("external")),
            },
            state_id: StateId(7),
            time_ms: -3,
            entries: vec![
                (Arc::from("ds=1"), Entry::Dir(BlobId([1; 32]))),
                (
                    Arc::from("f 0"),
                    Entry::File(FileEntry {
                        state_id: StateId(6),
                        time_ms: i64::MIN,
                        size: 9 << 20,
                        sha256: BlobId([2; 32]),
                        key: Some(BlobId([3; 32])),
                        pieces: Some(BlobId([4; 32])),
                        verified: "hdfs-md5md5crc32c",
                        source: "hdfs://nn/w/f 0".into(),
                    }),
                ),
                (
                    Arc::from("g"),
                    Entry::File(FileEntry {
                        state_id: StateId(7),
                        time_ms: 5,
                        size: 0,
                        sha256: BlobId([5; 32]),
                        key: None,
                        pieces: None,
                        verified: "sha256",
                        source: "".into(),
                    }),
                ),
            ],
        }
    }

    #[test]
    fn directory_objects_round_trip_for_every_kind() {
        for kind in [
            DirKind::Root,
            DirKind::Database,
            DirKind::Partition { depth: 2 },
            DirKind::Subdir,
        ] {
            let files = !matches!(kind, DirKind::Root | DirKind::Database);
            let mut d = sample();
            d.kind = kind;
            if !files {
                d.entries.truncate(1);
            }
            assert_eq!(DirObject::decode(&d.encode()).unwrap(), d);
        }
        let d = sample();
        assert_eq!(DirObject::decode(&d.encode()).unwrap(), d);
    }

    #[test]
    fn every_truncation_of_an_object_is_refused() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(DirObject::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(DirObject::decode(&longer).is_err());
    }

    #[test]
    fn non_canonical_or_hostile_objects_are_refused() {
        let mut unordered = sample();
        unordered.entries.swap(1, 2);
        let mut dup = sample();
        dup.entries[2].0 = Arc::from("f 0");
        let mut file_in_root = sample();
        file_in_root.kind = DirKind::Root;
        let mut dotdot = sample();
        dotdot.entries[0].0 = Arc::from("..");
        let mut slash = sample();
        slash.entries[0].0 = Arc::from("a/b");
        for d in [unordered, dup, file_in_root, dotdot, slash] {
            assert!(DirObject::decode(&d.encode()).is_err(), "{d:?}");
        }
        // A count far beyond the object's bytes is refused without
        // reserving for it.
        let mut huge = DirObject {
            entries: Vec::new(),
            ..sample()
        }
        .encode();
        let at = huge.len() - 4;
        huge[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(DirObject::decode(&huge).is_err());
    }
}
