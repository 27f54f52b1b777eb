//! Catalog checkpoints: what a restart needs, so it replays only the
//! journal after it.
//!
//! A checkpoint is taken at the visible state `S` (a committed state) and
//! holds every tree the catalog retained or pinned at that moment (`S`
//! among them), the duplicate-detection window at or below `S`
//! ([`crate::source::DupWindow`]) and the source position after event `S`.
//! Restart loads the newest readable checkpoint whose state is at or below
//! the commit record's visible state, then replays the journal records
//! after `S` on top of its tree (`replicate`). Node ids are *not* saved:
//! inode numbers only need to be stable for one mount (a restart is a new
//! FUSE session, the kernel forgot every inode at unmount), so restored
//! nodes get fresh ids, and a node shared by several retained versions is
//! written once and shared again after the restore (memory and GC marking
//! stay as before the restart).
//!
//! Files live in `<state>/checkpoints/<state-id, 20 digits>.ckpt`, written
//! with temp + fsync + rename + directory fsync, so a crash leaves the old
//! set or the new one. Format (all integers little-endian or LEB128):
//!
//! ```text
//! "STGFSC01" | version u32 | body | body length u64 | crc32c(body) u32 | "STGFSEND"
//! body = state | created_ms | resume (JSON) | window | nodes | versions
//! ```
//!
//! Nodes are written children first, each referring to its children by
//! index, so sharing is kept and a reader never meets a forward reference.
//! A file that fails any check (magic, version, length, checksum, a bad
//! index, a bad name) is unreadable: [`load_newest`] logs why, renames it to
//! `….ckpt.corrupt` (kept for inspection, never read again) and falls back
//! to the previous one; the reasons are returned for status.
//!
//! [`KEEP`] checkpoints are kept; journal compaction removes only records
//! at or below the *oldest* kept one, so falling back to the previous
//! checkpoint always finds the journal it needs.
//!
//! Called by `replicate` (the checkpoint thread writes, recovery reads).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use imbl::OrdMap;

use crate::catalog::{DirKind, DirNode, FileNode, Meta, Name, Node, NodeId, Tree};
use crate::durable::{fsync_dir, remove_in_steps, write_atomic_paced};
use crate::event::{BlobId, StateId};
use crate::source::Position;

/// Default: a checkpoint after this many journaled events...
pub const DEFAULT_CHECKPOINT_EVENTS: u64 = 250_000;
/// ...or after this long, whichever comes first (only when something new
/// was committed since the last one).
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(600);
/// Default rate a checkpoint is written at, in MiB/s (0: as fast as the
/// disk takes it). A checkpoint is background work; at full speed its
/// bytes sit in the disk's queue and cache ahead of every commit flush (see
/// [`crate::durable::write_atomic_paced`]). 16 MiB/s writes the checkpoint
/// of a million-file catalog (~80 MiB) in ~5 s; measured at 1,000 events/s
/// with such checkpoints written back to back, the commit lag p99 grew
/// 1.37× at 16 MiB/s, 1.5–1.75× at 32 and 2× at full speed
/// (docs/BENCHMARKS.md, C2).
pub const DEFAULT_CHECKPOINT_RATE_MIB: u64 = 16;
/// Appended to an old checkpoint's name while [`prune`] deletes it.
const REMOVING_SUFFIX: &str = ".removing";
/// Checkpoints kept on disk.
pub const KEEP: usize = 2;

const DIR: &str = "checkpoints";
const SUFFIX: &str = ".ckpt";
const MAGIC: &[u8; 8] = b"STGFSC01";
const END: &[u8; 8] = b"STGFSEND";
const VERSION: u32 = 1;
const HEAD_LEN: usize = 12;
const TAIL_LEN: usize = 20;

/// Everything a checkpoint holds.
#[derive(Debug, Clone)]
pub struct CheckpointData {
    /// The visible state when it was taken; replay continues after it.
    pub state: StateId,
    /// When it was written (Unix epoch ms).
    pub created_ms: i64,
    /// Where the source continues after event `state` (`None` for state 0).
    pub resume: Option<Position>,
    /// The duplicate-detection window at or below `state`.
    pub window: Vec<(StateId, u64)>,
    /// Retained and pinned trees, `state` among them.
    pub versions: BTreeMap<StateId, Arc<Tree>>,
}

/// A checkpoint read back by [`load_newest`].
#[derive(Debug)]
pub struct Loaded {
    pub data: CheckpointData,
    pub path: PathBuf,
    pub size: u64,
}

/// What [`load_newest`] found.
#[derive(Debug, Default)]
pub struct Found {
    pub loaded: Option<Loaded>,
    /// One line per checkpoint that could not be used, newest first.
    pub skipped: Vec<String>,
}

/// The checkpoint folder of a state folder.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR)
}

fn path_for(state_dir: &Path, state: StateId) -> PathBuf {
    dir(state_dir).join(format!("{:020}{SUFFIX}", state.0))
}

/// Checkpoint files, newest (highest state) first.
pub fn list(state_dir: &Path) -> io::Result<Vec<(StateId, PathBuf)>> {
    let d = dir(state_dir);
    let entries = match fs::read_dir(&d) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(digits) = name.to_str().and_then(|n| n.strip_suffix(SUFFIX)) else {
            continue;
        };
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(n) = digits.parse() {
            out.push((StateId(n), entry.path()));
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    Ok(out)
}

/// Writes `data` durably as the checkpoint of `data.state`; returns its
/// path and size. Creates the folder (durably) on first use. Setting
/// `stop` abandons the write (an `Interrupted` error; the temp file is
/// overwritten by the next write). `max_bytes_per_s` holds the write to
/// that rate (None: full speed).
pub fn write(
    state_dir: &Path,
    data: &CheckpointData,
    stop: Option<&AtomicBool>,
    max_bytes_per_s: Option<u64>,
) -> io::Result<(PathBuf, u64)> {
    let d = dir(state_dir);
    if !d.is_dir() {
        fs::create_dir_all(&d)?;
        fsync_dir(state_dir)?;
    }
    let path = path_for(state_dir, data.state);
    let size = write_atomic_paced(&path, max_bytes_per_s, |w| {
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        let mut body = Crc::new(w, stop);
        encode_body(&mut body, data)?;
        body.flush()?;
        let (len, crc) = (body.len, body.crc);
        let w = body.inner;
        w.write_all(&len.to_le_bytes())?;
        w.write_all(&crc.to_le_bytes())?;
        w.write_all(END)
    })?;
    Ok((path, size))
}

/// Removes all but the newest [`KEEP`] checkpoints; returns the state of
/// the oldest one kept (what journal compaction may remove through).
///
/// Each old checkpoint is first renamed out of the checkpoint names (to
/// `<name>.removing`, made durable), then deleted in steps
/// ([`remove_in_steps`]) so that freeing it does not hold up the commits'
/// flushes; a crash in between leaves a `.removing` file, never a cut
/// checkpoint under a checkpoint's name, and the next prune finishes it.
/// `stop` makes the deletion go at once.
pub fn prune(state_dir: &Path, stop: Option<&AtomicBool>) -> io::Result<Option<StateId>> {
    let all = list(state_dir)?;
    let d = dir(state_dir);
    let mut doomed = Vec::new();
    for (_, path) in all.iter().skip(KEEP) {
        let mut removing = path.clone().into_os_string();
        removing.push(REMOVING_SUFFIX);
        let removing = PathBuf::from(removing);
        match fs::rename(path, &removing) {
            Ok(()) => doomed.push(removing),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if !doomed.is_empty() {
        fsync_dir(&d)?;
    }
    // Left by a crash during an earlier prune.
    if let Ok(entries) = fs::read_dir(&d) {
        for entry in entries.flatten() {
            let path = entry.path();
            let leftover = path.to_str().is_some_and(|p| p.ends_with(REMOVING_SUFFIX));
            if leftover && !doomed.contains(&path) {
                doomed.push(path);
            }
        }
    }
    for path in &doomed {
        remove_in_steps(path, stop)?;
    }
    if !doomed.is_empty() {
        fsync_dir(&d)?;
    }
    Ok(all.iter().take(KEEP).next_back().map(|(s, _)| *s))
}

/// The newest readable checkpoint at or below `at_most` (the commit
/// record's visible state). Unreadable ones are logged, renamed to
/// `.corrupt` and reported in [`Found::skipped`].
pub fn load_newest(state_dir: &Path, at_most: StateId) -> io::Result<Found> {
    let mut found = Found::default();
    for (state, path) in list(state_dir)? {
        if state > at_most {
            let why = format!(
                "checkpoint {} is ahead of the committed state {at_most}; not used",
                path.display()
            );
            tracing::warn!("{why}");
            found.skipped.push(why);
            continue;
        }
        let bytes = fs::read(&path)?;
        let size = bytes.len() as u64;
        match decode(&bytes).and_then(|d| {
            if d.state == state {
                Ok(d)
            } else {
                Err(format!("it holds state {} instead", d.state))
            }
        }) {
            Ok(data) => {
                found.loaded = Some(Loaded { data, path, size });
                return Ok(found);
            }
            Err(reason) => {
                let aside = path.with_extension("ckpt.corrupt");
                let why = format!(
                    "checkpoint {} is unreadable ({reason}); moved to {} and using the previous one",
                    path.display(),
                    aside.display()
                );
                tracing::error!("{why}");
                fs::rename(&path, &aside)?;
                fsync_dir(&dir(state_dir))?;
                found.skipped.push(why);
            }
        }
    }
    Ok(found)
}

// ------------------------------------------------------------- encoding

/// Bytes [`Crc`] collects before it checksums and writes them: one
/// `crc32c` call and one write per chunk, not per field (a million-file
/// catalog has ~10 million fields).
const CHUNK: usize = 1 << 20;

/// A writer that counts and checksums what passes through it, in chunks
/// of [`CHUNK`] bytes; [`Crc::flush`] passes on the rest (`len` and `crc`
/// cover only what was flushed).
struct Crc<'a> {
    inner: &'a mut dyn Write,
    buf: Vec<u8>,
    len: u64,
    crc: u32,
    stop: Option<&'a AtomicBool>,
}

impl<'a> Crc<'a> {
    fn new(inner: &'a mut dyn Write, stop: Option<&'a AtomicBool>) -> Crc<'a> {
        Crc {
            inner,
            buf: Vec::with_capacity(CHUNK + 4096),
            len: 0,
            crc: 0,
            stop,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        self.len += self.buf.len() as u64;
        self.inner.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    fn check_stop(&self) -> io::Result<()> {
        if self.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "stopping: checkpoint abandoned",
            ));
        }
        Ok(())
    }

    fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn u8(&mut self, v: u8) -> io::Result<()> {
        self.bytes(&[v])
    }

    fn uv(&mut self, mut v: u64) -> io::Result<()> {
        let mut buf = [0u8; 10];
        let mut n = 0;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                buf[n] = byte;
                n += 1;
                break;
            }
            buf[n] = byte | 0x80;
            n += 1;
        }
        self.bytes(&buf[..n])
    }

    fn iv(&mut self, v: i64) -> io::Result<()> {
        self.uv(((v << 1) ^ (v >> 63)) as u64)
    }

    fn str(&mut self, s: &str) -> io::Result<()> {
        self.uv(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }
}

const VERIFIED: [&str; 3] = ["sha256", "hdfs-md5md5crc32c", "none"];

fn verified_code(label: &str) -> u8 {
    VERIFIED.iter().position(|v| *v == label).unwrap_or(2) as u8
}

fn encode_body(w: &mut Crc<'_>, data: &CheckpointData) -> io::Result<()> {
    w.uv(data.state.0)?;
    w.iv(data.created_ms)?;
    let resume = serde_json::to_vec(&data.resume).map_err(io::Error::other)?;
    w.uv(resume.len() as u64)?;
    w.bytes(&resume)?;
    w.uv(data.window.len() as u64)?;
    for (id, hash) in &data.window {
        w.uv(id.0)?;
        w.bytes(&hash.to_le_bytes())?;
    }
    let mut nodes = NodeWriter {
        index: HashMap::default(),
        next: 0,
    };
    // Node records first (their count is not known up front: a 0 tag ends
    // them), then the versions naming their roots.
    let mut roots = Vec::with_capacity(data.versions.len());
    for tree in data.versions.values() {
        roots.push(nodes.dir(w, &tree.root)?);
    }
    w.u8(0)?;
    w.uv(data.versions.len() as u64)?;
    for (tree, root) in data.versions.values().zip(roots) {
        w.uv(tree.state_id.0)?;
        w.iv(tree.time_ms)?;
        w.uv(u64::from(root))?;
    }
    Ok(())
}

struct NodeWriter {
    /// Index of every node written so far (a million files: a million
    /// entries, hence the cheap hash).
    index: HashMap<NodeId, u32, BuildHasherDefault<IdHasher>>,
    next: u32,
}

/// Hashes a [`NodeId`] (one `u64` from a counter) with one 128-bit
/// multiply folded to 64 bits, instead of SipHash: the keys are ours, not
/// an attacker's, and every bit of the id reaches the low and high bits
/// the table uses.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let p = u128::from(self.0 ^ n) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

const TAG_DIR: u8 = 1;
const TAG_FILE: u8 = 2;

impl NodeWriter {
    fn meta(w: &mut Crc<'_>, m: &Meta) -> io::Result<()> {
        w.uv(m.state_id.0)?;
        w.iv(m.time_ms)
    }

    fn assign(&mut self, id: NodeId) -> u32 {
        let i = self.next;
        self.index.insert(id, i);
        self.next += 1;
        i
    }

    fn dir(&mut self, w: &mut Crc<'_>, d: &DirNode) -> io::Result<u32> {
        if let Some(i) = self.index.get(&d.meta.id) {
            return Ok(*i);
        }
        w.check_stop()?;
        let mut children = Vec::with_capacity(d.children.len());
        for (name, child) in d.children.iter() {
            let i = match child {
                Node::Dir(c) => self.dir(w, c)?,
                Node::File(f) => self.file(w, f)?,
            };
            children.push((name, i));
        }
        w.u8(TAG_DIR)?;
        Self::meta(w, &d.meta)?;
        match &d.kind {
            DirKind::Root => w.u8(0)?,
            DirKind::Database => w.u8(1)?,
            DirKind::Table {
                partition_keys,
                not_in_log,
            } => {
                // 2: a table; 5: a table whose data is not in the log,
                // followed by the reason.
                w.u8(if not_in_log.is_some() { 5 } else { 2 })?;
                w.uv(partition_keys.len() as u64)?;
                for k in partition_keys.iter() {
                    w.str(k)?;
                }
                if let Some(reason) = not_in_log {
                    w.str(reason)?;
                }
            }
            DirKind::Partition { depth } => {
                w.u8(3)?;
                w.uv(u64::from(*depth))?;
            }
            DirKind::Subdir => w.u8(4)?,
        }
        w.uv(children.len() as u64)?;
        for (name, i) in children {
            w.str(name)?;
            w.uv(u64::from(i))?;
        }
        Ok(self.assign(d.meta.id))
    }

    fn file(&mut self, w: &mut Crc<'_>, f: &FileNode) -> io::Result<u32> {
        if let Some(i) = self.index.get(&f.meta.id) {
            return Ok(*i);
        }
        w.u8(TAG_FILE)?;
        Self::meta(w, &f.meta)?;
        w.bytes(&f.blob().0)?;
        w.uv(f.size())?;
        match f.resolved_key() {
            None => w.u8(0)?,
            Some(key) => {
                w.u8(1)?;
                w.bytes(&key.0)?;
            }
        }
        w.str(&f.source)?;
        w.u8(verified_code(f.verified))?;
        Ok(self.assign(f.meta.id))
    }
}

// ------------------------------------------------------------- decoding

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

type Res<T> = Result<T, String>;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Res<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Res<u8> {
        Ok(self.take(1)?[0])
    }

    fn uv(&mut self) -> Res<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("bad number at byte {}", self.pos))
    }

    fn iv(&mut self) -> Res<i64> {
        let u = self.uv()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn len(&mut self) -> Res<usize> {
        let n = self.uv()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.b.len() - self.pos)
            .ok_or_else(|| format!("length {n} past the end at byte {}", self.pos))
    }

    fn str(&mut self) -> Res<&'a str> {
        let n = self.len()?;
        std::str::from_utf8(self.take(n)?)
            .map_err(|_| format!("a name is not UTF-8 at byte {}", self.pos))
    }

    fn blob(&mut self) -> Res<BlobId> {
        let mut b = [0u8; 32];
        b.copy_from_slice(self.take(32)?);
        Ok(BlobId(b))
    }

    fn u64_le(&mut self) -> Res<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
}

/// Parses a whole checkpoint file; any damage is an `Err` with the reason.
pub fn decode(bytes: &[u8]) -> Result<CheckpointData, String> {
    if bytes.len() < HEAD_LEN + TAIL_LEN {
        return Err("too short".into());
    }
    if &bytes[..8] != MAGIC {
        return Err("bad magic".into());
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION {
        return Err(format!("unsupported version {version}"));
    }
    let tail = &bytes[bytes.len() - TAIL_LEN..];
    if &tail[12..] != END {
        return Err("no end marker (torn write?)".into());
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&tail[..8]);
    let len = u64::from_le_bytes(len);
    let crc = u32::from_le_bytes([tail[8], tail[9], tail[10], tail[11]]);
    let body = &bytes[HEAD_LEN..bytes.len() - TAIL_LEN];
    if len != body.len() as u64 {
        return Err(format!("body is {} bytes, header says {len}", body.len()));
    }
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    decode_body(&mut Reader { b: body, pos: 0 })
}

fn verified_label(code: u8) -> Res<&'static str> {
    VERIFIED
        .get(usize::from(code))
        .copied()
        .ok_or_else(|| format!("unknown verification code {code}"))
}

fn decode_body(r: &mut Reader<'_>) -> Res<CheckpointData> {
    let state = StateId(r.uv()?);
    let created_ms = r.iv()?;
    let n = r.len()?;
    let resume: Option<Position> =
        serde_json::from_slice(r.take(n)?).map_err(|e| format!("source position: {e}"))?;
    let n = r.len()?;
    let mut window = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let id = StateId(r.uv()?);
        window.push((id, r.u64_le()?));
    }
    let mut nodes: Vec<Node> = Vec::new();
    let name = Name::from;
    loop {
        let tag = r.u8()?;
        let node = match tag {
            0 => break,
            TAG_DIR => {
                let meta = Meta::restored(StateId(r.uv()?), r.iv()?);
                let kind = match r.u8()? {
                    0 => DirKind::Root,
                    1 => DirKind::Database,
                    kind @ (2 | 5) => {
                        let k = r.len()?;
                        let mut keys = Vec::with_capacity(k.min(64));
                        for _ in 0..k {
                            keys.push(name(r.str()?));
                        }
                        let not_in_log = if kind == 5 {
                            Some(Arc::from(r.str()?))
                        } else {
                            None
                        };
                        DirKind::Table {
                            partition_keys: keys.into(),
                            not_in_log,
                        }
                    }
                    3 => DirKind::Partition {
                        depth: u16::try_from(r.uv()?).map_err(|_| "bad partition depth")?,
                    },
                    4 => DirKind::Subdir,
                    k => return Err(format!("unknown directory kind {k}")),
                };
                let k = r.len()?;
                let mut children = OrdMap::new();
                for _ in 0..k {
                    let child_name = name(r.str()?);
                    let i = r.uv()?;
                    let child = usize::try_from(i)
                        .ok()
                        .and_then(|i| nodes.get(i))
                        .ok_or_else(|| format!("child index {i} is not an earlier node"))?;
                    children.insert(child_name, child.clone());
                }
                Node::Dir(Arc::new(DirNode {
                    meta,
                    kind,
                    children,
                }))
            }
            TAG_FILE => {
                let meta = Meta::restored(StateId(r.uv()?), r.iv()?);
                let blob = r.blob()?;
                let size = r.uv()?;
                let key = match r.u8()? {
                    0 => None,
                    1 => Some(r.blob()?),
                    k => return Err(format!("unknown file content kind {k}")),
                };
                let source: Box<str> = r.str()?.into();
                let verified = verified_label(r.u8()?)?;
                Node::File(Arc::new(FileNode::restored(
                    meta, blob, size, key, source, verified,
                )))
            }
            t => return Err(format!("unknown node tag {t}")),
        };
        nodes.push(node);
    }
    let n = r.len()?;
    let mut versions = BTreeMap::new();
    for _ in 0..n {
        let state_id = StateId(r.uv()?);
        let time_ms = r.iv()?;
        let i = r.uv()?;
        let root = usize::try_from(i)
            .ok()
            .and_then(|i| nodes.get(i))
            .and_then(Node::as_dir)
            .filter(|d| d.kind == DirKind::Root)
            .ok_or_else(|| format!("version {state_id} has no root directory"))?;
        versions.insert(
            state_id,
            Arc::new(Tree {
                state_id,
                time_ms,
                root: Arc::clone(root),
            }),
        );
    }
    if r.pos != r.b.len() {
        return Err(format!("{} bytes after the end", r.b.len() - r.pos));
    }
    if !versions.contains_key(&state) {
        return Err(format!("the tree of state {state} is missing"));
    }
    Ok(CheckpointData {
        state,
        created_ms,
        resume,
        window,
        versions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    fn ev(line: &str) -> Event {
        Event::parse_line(line.as_bytes()).unwrap()
    }

    /// Three versions sharing most of their nodes.
    fn versions() -> BTreeMap<StateId, Arc<Tree>> {
        let sha = "ab".repeat(32);
        let lines = [
            r#"{"id": 1, "time_ms": 1000, "op": "create_database", "db": "d"}"#.to_owned(),
            r#"{"id": 2, "op": "create_table", "db": "d", "table": "t", "partition_keys": ["p"]}"#
                .to_owned(),
            format!(
                r#"{{"id": 3, "time_ms": -5, "op": "add_files", "db": "d", "table": "t", "partition": {{"p": "1"}}, "files": [{{"name": "f", "path": "d/t/f", "size": 7, "sha256": "{sha}"}}]}}"#
            ),
            r#"{"id": 4, "op": "create_table", "db": "d", "table": "u"}"#.to_owned(),
        ];
        let mut tree = Arc::new(Tree::empty());
        let mut out = BTreeMap::new();
        for l in &lines {
            let (next, _) = tree.apply(&ev(l)).unwrap();
            tree = Arc::new(next);
            if tree.state_id.0 >= 2 {
                out.insert(tree.state_id, Arc::clone(&tree));
            }
        }
        out
    }

    fn data() -> CheckpointData {
        CheckpointData {
            state: StateId(4),
            created_ms: 1_700_000_000_000,
            resume: Some(Position::Hive { hive_event_id: 44 }),
            window: vec![(StateId(3), 33), (StateId(4), u64::MAX)],
            versions: versions(),
        }
    }

    fn shape(t: &Tree) -> Vec<(String, BlobId)> {
        let mut out = t.root.files_below();
        for (db, d) in t.root.children.iter() {
            for (name, _) in d.as_dir().unwrap().children.iter() {
                out.push((format!("{db}/{name}/"), BlobId([0; 32])));
            }
        }
        out
    }

    #[test]
    fn checkpoint_round_trips_trees_window_position_and_sharing() {
        let dir = tempfile::tempdir().unwrap();
        let d = data();
        let (path, size) = write(dir.path(), &d, None, None).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), size);
        let back = decode(&fs::read(&path).unwrap()).unwrap();
        assert_eq!((back.state, back.created_ms), (d.state, d.created_ms));
        assert_eq!(back.resume, d.resume);
        assert_eq!(back.window, d.window);
        assert_eq!(
            back.versions.keys().collect::<Vec<_>>(),
            d.versions.keys().collect::<Vec<_>>()
        );
        for (s, t) in &d.versions {
            let b = &back.versions[s];
            assert_eq!(shape(b), shape(t), "state {s}");
            assert_eq!(b.time_ms, t.time_ms);
            let f = b.lookup(&["d".into(), "t".into(), "p=1".into()], "f");
            if let Some(Node::File(f)) = f {
                assert_eq!((f.size(), f.verified, f.meta.time_ms), (7, "sha256", -5));
            }
        }
        // Table t did not change between 3 and 4: one node again.
        let t3 = back.versions[&StateId(3)].table("d", "t").unwrap();
        let t4 = back.versions[&StateId(4)].table("d", "t").unwrap();
        assert!(Arc::ptr_eq(t3, t4));
        assert_ne!(
            t3.meta.id,
            d.versions[&StateId(3)].table("d", "t").unwrap().meta.id
        );
    }

    #[test]
    fn any_damaged_byte_makes_a_checkpoint_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write(dir.path(), &data(), None, None).unwrap();
        let good = fs::read(&path).unwrap();
        for i in (0..good.len()).step_by(7) {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flipped byte {i} went unnoticed");
        }
        for cut in [0, 10, good.len() / 2, good.len() - 1] {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn unreadable_newest_checkpoint_falls_back_to_the_previous_and_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = data();
        let mut older = d.clone();
        older.state = StateId(3);
        older.versions.remove(&StateId(4));
        write(dir.path(), &older, None, None).unwrap();
        let (newest, _) = write(dir.path(), &d, None, None).unwrap();
        let mut bytes = fs::read(&newest).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        fs::write(&newest, bytes).unwrap();
        let found = load_newest(dir.path(), StateId(10)).unwrap();
        assert_eq!(
            found.loaded.as_ref().map(|l| l.data.state),
            Some(StateId(3))
        );
        assert_eq!(found.skipped.len(), 1);
        assert!(
            found.skipped[0].contains("checksum mismatch"),
            "{:?}",
            found.skipped
        );
        assert!(!newest.exists());
        assert!(newest.with_extension("ckpt.corrupt").exists());
        // A checkpoint ahead of the commit record is not used.
        d.state = StateId(4);
        write(dir.path(), &d, None, None).unwrap();
        let found = load_newest(dir.path(), StateId(3)).unwrap();
        assert_eq!(found.loaded.map(|l| l.data.state), Some(StateId(3)));
        // Pruning keeps the newest KEEP and names the oldest kept.
        let mut e = data();
        e.state = StateId(4);
        for s in [5, 6] {
            let (_, t) = e.versions.pop_last().unwrap();
            let t = Arc::new(Tree {
                state_id: StateId(s),
                ..(*t).clone()
            });
            e.versions.insert(StateId(s), t);
            e.state = StateId(s);
            write(dir.path(), &e, None, None).unwrap();
        }
        // A checkpoint whose deletion a crash interrupted.
        let leftover = dir
            .path()
            .join(DIR)
            .join(format!("{:020}{SUFFIX}{REMOVING_SUFFIX}", 2));
        fs::write(&leftover, b"cut").unwrap();
        assert_eq!(prune(dir.path(), None).unwrap(), Some(StateId(5)));
        let left: Vec<StateId> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(left, vec![StateId(6), StateId(5)]);
        let mut names: Vec<String> = fs::read_dir(dir.path().join(DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(SUFFIX) || n.ends_with(REMOVING_SUFFIX))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![format!("{:020}{SUFFIX}", 5), format!("{:020}{SUFFIX}", 6)]
        );
    }

    #[test]
    fn a_stop_request_abandons_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(true);
        let e = write(dir.path(), &data(), Some(&stop), None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert!(list(dir.path()).unwrap().is_empty());
    }
}
