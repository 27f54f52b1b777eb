//! The journal: stagefs's own write-ahead log of accepted events.
//!
//! Owns the journal directory (segment files, see `segment.rs` for the format)
//! and an in-memory ring of the most recent durable records. `ingest` is the
//! single writer: it [`Journal::append`]s a batch of events (serialised by
//! `event`) and calls [`Journal::sync`] once per batch (group commit). The
//! stager, and replay after a restart, read through [`Follower`]s. A
//! record's payload is a [`JournalEntry`] (the event and the source position
//! after it), encoded and decoded in `record.rs`.
//!
//! Invariants:
//! - Record ids strictly increase across the whole journal; segment `N.seg`
//!   starts with record `N`, so a segment index is a sorted list of names.
//! - A record becomes visible to followers only after it is written and
//!   fdatasynced (and, for a new segment, its directory entry fsynced).
//!   Followers never read a segment past its published durable length.
//! - The ring holds *every* durable record with id > `ring_base`, in order.
//!   A follower whose cursor is at or past `ring_base` reads the ring (no
//!   copies: records are `Arc`s); otherwise it reads segment files until its
//!   cursor reaches `ring_base` again. Ring and index change together under
//!   one lock, so a follower never skips or repeats a record.
//! - After a failed write or fsync the writer refuses further writes: what
//!   reached the disk is unknown (fsync errors are not retryable on Linux).
//!   [`Journal::reset_after_failure`] cuts the files back to the durable
//!   end (as reopening would) and lets the writer append again.
//! - Recovery (in [`Journal::open`]) cuts a torn tail of the last segment; it
//!   is never replayed. Damage anywhere else, or a cut that would drop a
//!   committed record ([`JournalConfig::durable_through`]), stops recovery
//!   with an error and changes nothing.

mod follower;
mod record;
mod recovery;
mod segment;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::durable::fsync_dir;
use crate::event::StateId;

pub use follower::Follower;
pub use record::{encode_entry, journal_payload, JournalEntry};
pub use segment::MAX_PAYLOAD;

/// Default size after which a new segment is started.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default number of recent records kept in memory for followers.
pub const DEFAULT_RING_CAPACITY: usize = 65_536;
/// Default bound on the payload bytes of the records kept in memory.
pub const DEFAULT_RING_BYTES: usize = 64 << 20;
/// File in the journal directory naming the newest id whose records
/// compaction may have deleted (see [`Compactor`]).
const FLOOR_FILE: &str = "compacted-through";

/// Where the journal lives and how it is shaped.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    pub dir: PathBuf,
    /// A new segment is started once the current one reaches this size
    /// (a segment may exceed it by one record).
    pub segment_bytes: u64,
    /// Durable records kept in memory; 0 makes every follower read files.
    pub ring_capacity: usize,
    /// Bound on the payload bytes of the records kept in memory (the ring
    /// holds fewer than `ring_capacity` records when they are large).
    pub ring_bytes: usize,
    /// The newest id known to be committed (the commit record's visible
    /// state): recovery refuses to cut any record at or below it.
    pub durable_through: StateId,
    /// Asked between segments (and every 65,536 records) while recovery
    /// scans: `true` stops it with [`JournalError::Cancelled`], changing
    /// nothing (Ctrl-C during a long start).
    pub cancel: Option<fn() -> bool>,
}

impl JournalConfig {
    /// A config with the default segment size and ring capacity.
    pub fn new(dir: impl Into<PathBuf>) -> JournalConfig {
        JournalConfig {
            dir: dir.into(),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            ring_capacity: DEFAULT_RING_CAPACITY,
            ring_bytes: DEFAULT_RING_BYTES,
            durable_through: StateId(0),
            cancel: None,
        }
    }
}

/// One journal record: an opaque payload keyed by its state-id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: StateId,
    pub payload: Vec<u8>,
}

/// What [`Journal::open`] found and what it had to cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Intact records kept.
    pub records: u64,
    /// Id of the last intact record.
    pub last_id: Option<StateId>,
    /// Bytes removed from the tail of the last segment (a torn or corrupt
    /// record and everything after it).
    pub truncated_bytes: u64,
    /// Why the tail was cut, if it was.
    pub reason: Option<String>,
}

/// Counters shared by the writer and all followers.
#[derive(Debug, Default)]
pub struct JournalStats {
    /// Records followers took from the in-memory ring.
    pub ring_reads: AtomicU64,
    /// Records followers read back from segment files.
    pub file_reads: AtomicU64,
    /// Records accepted by `append`.
    pub appended: AtomicU64,
    /// `sync` calls that wrote records.
    pub syncs: AtomicU64,
    /// Bytes written to segments (headers and framing included).
    pub bytes: AtomicU64,
}

/// Errors of the journal. I/O errors name the file and what was being done.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot {verb} {}: {source}", path.display())]
    Io {
        verb: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Ids must strictly increase; `last` is 0 for an empty journal (so id 0
    /// is never accepted: a follower starting "after 0" would miss it).
    #[error("state-id {got} does not follow the last appended state-id {last}")]
    NotIncreasing { last: StateId, got: StateId },
    #[error("payload of {len} bytes exceeds the {max}-byte record limit")]
    PayloadTooLarge { len: usize, max: usize },
    /// A record that recovery accepted (or the writer published) fails to
    /// read back: the disk changed under us.
    #[error("corrupt journal record in {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// Recovery found damage that a crash cannot explain: a bad record,
    /// torn header or record-less segment before the last segment (the
    /// writer syncs a segment before starting the next). Nothing was changed.
    #[error("journal segment {} is corrupt at offset {offset} ({reason}), before the tail of the last segment, so it is not a torn write; recovery changed no file: inspect it, restore the state folder, or remove the state folder to replicate from the start", path.display())]
    CorruptBeforeTail {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The last segment is damaged at `offset`, but cutting there would drop
    /// records the commit record says are committed. Nothing was changed.
    #[error("journal segment {} is damaged at offset {offset} ({reason}); cutting the tail there would drop committed state {durable} (the last intact record is {last_intact}); recovery changed no file: inspect it, restore the state folder, or remove the state folder to replicate from the start", path.display())]
    CutBelowCommit {
        path: PathBuf,
        offset: u64,
        reason: String,
        last_intact: StateId,
        durable: StateId,
    },
    /// Recovery was asked to stop (`JournalConfig::cancel`); nothing changed.
    #[error("journal recovery was interrupted")]
    Cancelled,
    /// An earlier write or fsync failed; reopen the journal to recover.
    #[error("the journal refuses writes after an earlier failure: {0}")]
    Failed(String),
}

impl JournalError {
    /// True when the disk (or quota) is full: clears once space is freed.
    pub fn is_no_space(&self) -> bool {
        matches!(self, JournalError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)))
    }

    fn io(verb: &'static str, path: &Path, source: io::Error) -> JournalError {
        JournalError::Io {
            verb,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Index entry for one segment: its first record and its durable length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SegmentInfo {
    first_id: StateId,
    len: u64,
}

/// State shared by the writer and its followers.
struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    /// Signalled after every publish and on close.
    published: Condvar,
    /// Mirror of `State::ring_base`, so a follower reading files can notice
    /// that it may re-attach to the ring without taking the lock per record.
    ring_base: AtomicU64,
    /// Mirror of `State::closed` for the same lock-free path.
    closed: AtomicBool,
    stats: Arc<JournalStats>,
}

struct State {
    ring: VecDeque<Arc<Record>>,
    /// Payload bytes of the records in `ring`.
    ring_bytes: usize,
    /// Every durable record with an id above this is in `ring`.
    ring_base: StateId,
    /// Durable segments, ordered by first id.
    segments: Vec<SegmentInfo>,
    /// Followers holding each segment open (by first id; absent: none), so
    /// compaction knows which removed segments nobody reads any more.
    open_readers: HashMap<StateId, usize>,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated by plain assignments that cannot panic
        // half-way, so a poisoned lock still guards consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Index of the segment that holds the first record after `cursor` (or,
    /// if that record is not durable yet, the last segment).
    fn segment_for(&self, cursor: StateId) -> Option<usize> {
        let wanted = cursor.0.saturating_add(1);
        let after = self.segments.partition_point(|s| s.first_id.0 <= wanted);
        if self.segments.is_empty() {
            None
        } else {
            Some(after.saturating_sub(1))
        }
    }
}

/// The segment the writer appends to.
struct ActiveSegment {
    first_id: StateId,
    path: PathBuf,
    file: File,
    /// Bytes written so far (durable once `sync` returns).
    len: u64,
}

/// A record appended but not yet synced, and where its framing ends in the
/// pending buffer.
struct Pending {
    record: Arc<Record>,
    end: usize,
}

/// The single writer of the journal.
pub struct Journal {
    shared: Arc<Shared>,
    segment_bytes: u64,
    ring_capacity: usize,
    ring_bytes: usize,
    active: Option<ActiveSegment>,
    /// Framed bytes of `pending`, written with one `write` per segment.
    buf: Vec<u8>,
    pending: Vec<Pending>,
    last_appended: StateId,
    last_durable: Option<StateId>,
    failed: Option<String>,
    /// Segments created by a write whose sync has not succeeded yet:
    /// [`Journal::reset_after_failure`] removes them.
    unsynced_segments: Vec<PathBuf>,
    /// A segment was created since the directory was last fsynced.
    dir_unsynced: bool,
    /// A [`SyncTicket`] is out (begun, not finished).
    in_flight: bool,
}

/// Records written to the active segment whose fdatasync is still to come
/// ([`Journal::begin_sync`]); holds its own handle of the segment file.
pub struct SyncTicket {
    file: File,
    path: PathBuf,
    written: Vec<SegmentInfo>,
    records: Vec<Pending>,
    last: StateId,
}

impl SyncTicket {
    /// fdatasyncs the segment the records were written to (any thread).
    pub fn sync_data(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// The newest id the ticket makes durable.
    pub fn last_id(&self) -> StateId {
        self.last
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `config.dir`, recovering it
    /// first: a torn or corrupt tail is truncated and reported.
    pub fn open(config: JournalConfig) -> Result<(Journal, RecoveryReport), JournalError> {
        let recovered = recovery::recover(&config.dir, config.durable_through, config.cancel)?;
        let report = recovered.report;
        let active = match recovered.segments.last() {
            Some(last) => {
                let path = segment::segment_path(&config.dir, last.first_id);
                let file = OpenOptions::new().append(true).open(&path).map_err(|e| {
                    JournalError::io("open journal segment for appending", &path, e)
                })?;
                Some(ActiveSegment {
                    first_id: last.first_id,
                    path,
                    file,
                    len: last.len,
                })
            }
            None => None,
        };
        let base = report.last_id.unwrap_or_default();
        tracing::info!(
            dir = %config.dir.display(),
            records = report.records,
            last_id = base.0,
            segments = recovered.segments.len(),
            "journal opened"
        );
        let shared = Arc::new(Shared {
            dir: config.dir,
            state: Mutex::new(State {
                ring: VecDeque::with_capacity(config.ring_capacity.min(DEFAULT_RING_CAPACITY)),
                ring_bytes: 0,
                ring_base: base,
                segments: recovered.segments,
                open_readers: HashMap::new(),
                closed: false,
            }),
            published: Condvar::new(),
            ring_base: AtomicU64::new(base.0),
            closed: AtomicBool::new(false),
            stats: Arc::new(JournalStats::default()),
        });
        let journal = Journal {
            shared,
            segment_bytes: config.segment_bytes.max(1),
            ring_capacity: config.ring_capacity,
            ring_bytes: config.ring_bytes,
            active,
            buf: Vec::new(),
            pending: Vec::new(),
            last_appended: base,
            last_durable: report.last_id,
            failed: None,
            unsynced_segments: Vec::new(),
            dir_unsynced: false,
            in_flight: false,
        };
        Ok((journal, report))
    }

    /// Buffers a record: not yet durable and not yet visible to followers.
    /// Ids must strictly increase past every id appended before.
    pub fn append(&mut self, id: StateId, payload: &[u8]) -> Result<(), JournalError> {
        if let Some(why) = &self.failed {
            return Err(JournalError::Failed(why.clone()));
        }
        if payload.len() > MAX_PAYLOAD {
            return Err(JournalError::PayloadTooLarge {
                len: payload.len(),
                max: MAX_PAYLOAD,
            });
        }
        if id <= self.last_appended {
            return Err(JournalError::NotIncreasing {
                last: self.last_appended,
                got: id,
            });
        }
        segment::encode_record(&mut self.buf, id, payload);
        self.pending.push(Pending {
            record: Arc::new(Record {
                id,
                payload: payload.to_vec(),
            }),
            end: self.buf.len(),
        });
        self.last_appended = id;
        self.shared.stats.appended.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the buffered records, fdatasyncs them (and the directory when a
    /// segment was created), then publishes them to the ring and wakes
    /// followers. A no-op when nothing is buffered.
    pub fn sync(&mut self) -> Result<(), JournalError> {
        match self.begin_sync()? {
            None => Ok(()),
            Some(ticket) => {
                let synced = ticket.sync_data();
                self.finish_sync(ticket, synced)
            }
        }
    }

    /// [`Journal::sync`] in two steps, so that the final fdatasync can run
    /// on another thread while more records are appended: writes the
    /// buffered records to their segment files (a sealed segment and a new
    /// segment's directory entry are synced here, as in `sync`) and returns
    /// the ticket whose [`SyncTicket::sync_data`] makes them durable; pass
    /// its outcome to [`Journal::finish_sync`], which publishes them. Records
    /// appended meanwhile wait for the next sync. One ticket at a time:
    /// until it is finished, `begin_sync` and `sync` refuse. `None` when
    /// nothing is buffered.
    pub fn begin_sync(&mut self) -> Result<Option<SyncTicket>, JournalError> {
        if let Some(why) = &self.failed {
            return Err(JournalError::Failed(why.clone()));
        }
        if self.in_flight {
            return Err(JournalError::Failed(
                "a journal sync was begun while the previous one was not finished".into(),
            ));
        }
        if self.pending.is_empty() {
            return Ok(None);
        }
        let written = match self.write_pending() {
            Ok(written) => written,
            Err(e) => {
                tracing::error!(error = %e, "journal write failed; refusing further writes");
                self.failed = Some(e.to_string());
                return Err(e);
            }
        };
        let Some(active) = &self.active else {
            // write_pending leaves an active segment whenever it wrote.
            let e = JournalError::Failed("no active journal segment after a write".into());
            self.failed = Some(e.to_string());
            return Err(e);
        };
        let file = match active.file.try_clone() {
            Ok(f) => f,
            Err(e) => {
                let e = JournalError::io("duplicate the journal segment handle", &active.path, e);
                self.failed = Some(e.to_string());
                return Err(e);
            }
        };
        // Keep the buffer's allocation for the next batch unless one huge
        // batch blew it up.
        self.buf.clear();
        if self.buf.capacity() > 4 * DEFAULT_SEGMENT_BYTES as usize {
            self.buf.shrink_to(DEFAULT_SEGMENT_BYTES as usize);
        }
        self.in_flight = true;
        Ok(Some(SyncTicket {
            file,
            path: active.path.clone(),
            written,
            records: std::mem::take(&mut self.pending),
            last: self.last_appended,
        }))
    }

    /// The ticket of the sync in flight was lost (the thread syncing it
    /// ended): its records are not known durable, so the writer refuses
    /// further writes until [`Journal::reset_after_failure`]. Returns the
    /// error to report.
    pub fn sync_lost(&mut self) -> JournalError {
        self.in_flight = false;
        let e = JournalError::Failed("the journal sync thread stopped".into());
        self.failed = Some(e.to_string());
        e
    }

    /// Ends the sync `ticket` was begun for, with the outcome of its
    /// [`SyncTicket::sync_data`]: publishes its records to followers, or on
    /// failure refuses further writes until [`Journal::reset_after_failure`]
    /// (which forgets every record not durable: the ticket's and those
    /// appended since).
    pub fn finish_sync(
        &mut self,
        ticket: SyncTicket,
        synced: std::io::Result<()>,
    ) -> Result<(), JournalError> {
        self.in_flight = false;
        if let Err(e) = synced {
            let e = JournalError::io("fdatasync journal segment", &ticket.path, e);
            tracing::error!(error = %e, "journal sync failed; refusing further writes");
            self.failed = Some(e.to_string());
            return Err(e);
        }
        if let Err(e) = self.sync_new_segments() {
            tracing::error!(error = %e, "journal sync failed; refusing further writes");
            self.failed = Some(e.to_string());
            return Err(e);
        }
        self.publish(ticket.written, ticket.records, ticket.last);
        Ok(())
    }

    /// Makes the writer usable again after a failed write or sync (a full
    /// disk, say): forgets the records not yet durable (never published, so
    /// no follower saw them), removes segments created since the last
    /// successful sync and truncates the last durable segment back to its
    /// durable length (fsynced), so the files are a clean prefix again. The
    /// caller appends what it still needs. Bytes up to the durable length
    /// were synced successfully before, so nothing durable is touched. On
    /// error the writer stays failed; calling again retries. A no-op when
    /// nothing failed.
    pub fn reset_after_failure(&mut self) -> Result<(), JournalError> {
        if self.failed.is_none() {
            return Ok(());
        }
        self.pending.clear();
        self.buf.clear();
        self.active = None;
        let dir = self.shared.dir.clone();
        let durable = self.shared.lock().segments.last().copied();
        let created = std::mem::take(&mut self.unsynced_segments);
        for (i, path) in created.iter().enumerate() {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    // Still ours to remove on the next attempt.
                    self.unsynced_segments = created[i..].to_vec();
                    return Err(JournalError::io("remove unsynced journal segment", path, e));
                }
            }
        }
        if !created.is_empty() {
            fsync_dir(&dir).map_err(|e| JournalError::io("fsync journal directory", &dir, e))?;
        }
        if let Some(d) = durable {
            let path = segment::segment_path(&dir, d.first_id);
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(|e| JournalError::io("open journal segment for appending", &path, e))?;
            file.set_len(d.len)
                .map_err(|e| JournalError::io("truncate journal segment", &path, e))?;
            file.sync_all()
                .map_err(|e| JournalError::io("fsync truncated journal segment", &path, e))?;
            self.active = Some(ActiveSegment {
                first_id: d.first_id,
                path,
                file,
                len: d.len,
            });
        }
        self.last_appended = self.last_durable.unwrap_or_default();
        self.dir_unsynced = false;
        self.failed = None;
        tracing::info!(dir = %dir.display(), "journal writable again after a failure");
        Ok(())
    }

    /// Writes `pending`, rotating segments as they fill (a sealed segment is
    /// fdatasynced before its successor gets records); the last segment's
    /// fdatasync and the directory's are left to the caller. Returns the
    /// index entries to publish, in segment order.
    fn write_pending(&mut self) -> Result<Vec<SegmentInfo>, JournalError> {
        let mut written: Vec<SegmentInfo> = Vec::new();
        let mut created_segment = false;
        let mut start = 0usize;
        let mut i = 0usize;
        while i < self.pending.len() {
            let mut active = match self.active.take() {
                Some(a) if a.len < self.segment_bytes => a,
                sealed => {
                    if let Some(old) = sealed {
                        // The sealed segment must be durable before records
                        // land in its successor, or recovery could keep a
                        // later record while an earlier one is lost.
                        old.file.sync_data().map_err(|e| {
                            JournalError::io("fdatasync journal segment", &old.path, e)
                        })?;
                    }
                    created_segment = true;
                    let created = self.create_segment(self.pending[i].record.id)?;
                    self.unsynced_segments.push(created.path.clone());
                    created
                }
            };
            // Take records until the segment is full; at least one, so a
            // record larger than segment_bytes still makes progress.
            let mut end = start;
            let mut len = active.len;
            while i < self.pending.len() {
                let framed = self.pending[i].end - end;
                end = self.pending[i].end;
                len += framed as u64;
                i += 1;
                if len >= self.segment_bytes {
                    break;
                }
            }
            active
                .file
                .write_all(&self.buf[start..end])
                .map_err(|e| JournalError::io("write journal segment", &active.path, e))?;
            active.len = len;
            self.shared
                .stats
                .bytes
                .fetch_add((end - start) as u64, Ordering::Relaxed);
            match written.last_mut() {
                Some(w) if w.first_id == active.first_id => w.len = len,
                _ => written.push(SegmentInfo {
                    first_id: active.first_id,
                    len,
                }),
            }
            self.active = Some(active);
            start = end;
        }
        self.dir_unsynced |= created_segment;
        Ok(written)
    }

    /// After the active segment's fdatasync: the directory entries of the
    /// segments the write created become durable too (then nothing written
    /// is lost to a crash).
    fn sync_new_segments(&mut self) -> Result<(), JournalError> {
        if self.dir_unsynced {
            fsync_dir(&self.shared.dir)
                .map_err(|e| JournalError::io("fsync journal directory", &self.shared.dir, e))?;
            self.dir_unsynced = false;
        }
        self.unsynced_segments.clear();
        Ok(())
    }

    fn create_segment(&self, first_id: StateId) -> Result<ActiveSegment, JournalError> {
        let path = segment::segment_path(&self.shared.dir, first_id);
        // create_new: recovery removed every segment at or past the durable
        // tail, so an existing file here means two writers or a bug.
        let mut file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| JournalError::io("create journal segment", &path, e))?;
        let header = segment::encode_header();
        file.write_all(&header)
            .map_err(|e| JournalError::io("write journal segment header", &path, e))?;
        self.shared
            .stats
            .bytes
            .fetch_add(header.len() as u64, Ordering::Relaxed);
        tracing::debug!(segment = %path.display(), "journal segment created");
        Ok(ActiveSegment {
            first_id,
            path,
            file,
            len: segment::HEADER_LEN,
        })
    }

    /// Makes synced records visible: index lengths, ring, then wake-up.
    fn publish(&mut self, written: Vec<SegmentInfo>, mut records: Vec<Pending>, last: StateId) {
        let shared = Arc::clone(&self.shared);
        let mut st = shared.lock();
        for w in written {
            match st.segments.last_mut() {
                Some(s) if s.first_id == w.first_id => s.len = w.len,
                _ => st.segments.push(w),
            }
        }
        // Only the newest ring_capacity records of the batch can stay; the
        // rest would be evicted at once, so skip straight past them.
        let keep_from = records.len().saturating_sub(self.ring_capacity);
        if keep_from > 0 {
            st.ring.clear();
            st.ring_bytes = 0;
            st.ring_base = records[keep_from - 1].record.id;
        }
        for p in records.drain(keep_from..) {
            let bytes = p.record.payload.len();
            while !st.ring.is_empty()
                && (st.ring.len() >= self.ring_capacity || st.ring_bytes + bytes > self.ring_bytes)
            {
                if let Some(evicted) = st.ring.pop_front() {
                    st.ring_bytes -= evicted.payload.len();
                    st.ring_base = evicted.id;
                }
            }
            if self.ring_capacity == 0 || bytes > self.ring_bytes {
                // Never kept in memory: followers read it from the file.
                st.ring_base = p.record.id;
                continue;
            }
            st.ring_bytes += bytes;
            st.ring.push_back(p.record);
        }
        shared.ring_base.store(st.ring_base.0, Ordering::Release);
        drop(st);
        shared.published.notify_all();

        self.last_durable = Some(last);
        shared.stats.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// The last durable (synced) id.
    pub fn last_id(&self) -> Option<StateId> {
        self.last_durable
    }

    /// A reader of every durable record with id > `after`, in order.
    pub fn follower(&self, after: StateId) -> Follower {
        Follower::new(Arc::clone(&self.shared), after)
    }

    /// Counters shared with all followers.
    pub fn stats(&self) -> Arc<JournalStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Wakes every follower and makes all their reads return `Ok(None)`
    /// from now on (shutdown). Writes still work but nobody follows them.
    pub fn close(&self) {
        let mut st = self.shared.lock();
        st.closed = true;
        self.shared.closed.store(true, Ordering::Release);
        drop(st);
        self.shared.published.notify_all();
    }

    /// The journal directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// A handle that removes old segments and reports the journal's size;
    /// usable from another thread than the writer's.
    pub fn compactor(&self) -> Compactor {
        Compactor {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Segments on disk and their durable bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalSize {
    pub segments: u64,
    pub bytes: u64,
    /// The first record id the journal can still hold (the first segment's).
    pub first_id: Option<StateId>,
}

/// Removes segments that restart no longer needs (journal compaction) and
/// reports the journal's size. Never touches the last segment, which the
/// writer appends to.
///
/// Before anything is removed, the id through which records may be gone
/// is written durably to the journal directory ([`compacted_through`]), so
/// a restart that would need them fails with a clear error instead of
/// silently replaying a journal with a hole.
#[derive(Clone)]
pub struct Compactor {
    shared: Arc<Shared>,
}

impl Compactor {
    /// Deletes every segment all of whose records are at or below
    /// `through`: a segment goes when the next one starts at or before
    /// `through + 1` (so with gaps in the ids a segment may stay one round
    /// longer). Returns the number of segments removed.
    ///
    /// A segment no follower holds open is renamed out of the journal's
    /// names and then cut in steps ([`crate::durable::remove_in_steps`]):
    /// freeing 64 MiB at once makes the device discard it in one go, and
    /// every commit's flush waits behind that. One a follower still holds
    /// is unlinked at once (its reader keeps the open descriptor, and the
    /// blocks are freed when it closes). Once `stop` is set, the rest goes
    /// at once. A rename left behind by a crash is removed by the next
    /// [`Journal::open`].
    pub fn remove_through(
        &self,
        through: StateId,
        stop: Option<&AtomicBool>,
    ) -> Result<usize, JournalError> {
        let doomed: Vec<StateId> = {
            let st = self.shared.lock();
            st.segments
                .windows(2)
                .take_while(|w| w[1].first_id.0 <= through.0.saturating_add(1))
                .map(|w| w[0].first_id)
                .collect()
        };
        if doomed.is_empty() {
            return Ok(0);
        }
        let dir = &self.shared.dir;
        let floor = dir.join(FLOOR_FILE);
        let previous = compacted_through(dir)?;
        if previous.is_none_or(|p| p < through) {
            crate::durable::write_atomic(&floor, format!("{}\n", through.0).as_bytes())
                .map_err(|e| JournalError::io("record journal compaction", &floor, e))?;
        }
        let held: Vec<bool> = {
            // Out of the index first: a follower never opens a segment
            // that is about to disappear, so one that nobody holds now
            // stays unread.
            let mut st = self.shared.lock();
            st.segments.retain(|s| !doomed.contains(&s.first_id));
            doomed
                .iter()
                .map(|first| st.open_readers.get(first).is_some_and(|&n| n > 0))
                .collect()
        };
        let mut in_steps = Vec::new();
        for (first, held) in doomed.iter().zip(held) {
            let path = segment::segment_path(dir, *first);
            let result = if held {
                std::fs::remove_file(&path)
            } else {
                let removing = segment::removing_path(&path);
                let renamed = std::fs::rename(&path, &removing);
                if renamed.is_ok() {
                    in_steps.push(removing);
                }
                renamed
            };
            match result {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(JournalError::io(
                        "remove compacted journal segment",
                        &path,
                        e,
                    ))
                }
            }
        }
        fsync_dir(dir).map_err(|e| JournalError::io("fsync journal directory", dir, e))?;
        for path in &in_steps {
            crate::durable::remove_in_steps(path, stop)
                .map_err(|e| JournalError::io("remove compacted journal segment", path, e))?;
        }
        tracing::info!(
            segments = doomed.len(),
            through = through.0,
            "journal compacted"
        );
        Ok(doomed.len())
    }

    /// A reader of every durable record with id > `after` (like
    /// [`Journal::follower`], without the writer's lock).
    pub fn follower(&self, after: StateId) -> Follower {
        Follower::new(Arc::clone(&self.shared), after)
    }

    /// Segments and durable bytes now.
    pub fn size(&self) -> JournalSize {
        let st = self.shared.lock();
        JournalSize {
            segments: st.segments.len() as u64,
            bytes: st.segments.iter().map(|s| s.len).sum(),
            first_id: st.segments.first().map(|s| s.first_id),
        }
    }
}

/// The newest id whose records compaction may have removed from the journal
/// in `dir`, or `None` when it was never compacted.
pub fn compacted_through(dir: &Path) -> Result<Option<StateId>, JournalError> {
    let path = dir.join(FLOOR_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            text.trim()
                .parse()
                .map(|n| Some(StateId(n)))
                .map_err(|_| JournalError::Corrupt {
                    path: path.clone(),
                    offset: 0,
                    reason: format!("not a state-id: {:?}", text.trim()),
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JournalError::io("read", &path, e)),
    }
}
