//! Followers: ordered readers of durable journal records.
//!
//! A follower reads from the in-memory ring while its cursor is at or past
//! the ring's base, and from the segment files when it has fallen behind (or
//! after a restart, when the ring starts empty): it binary-searches the
//! segment index for the segment holding the next wanted id, scans it
//! sequentially through a large `BufReader`, crosses into later segments, and
//! re-attaches to the ring as soon as its cursor reaches the ring's base.
//!
//! File reads never pass a segment's durable length as published under the
//! journal lock, so unsynced or half-written bytes are never interpreted.
//! Each open segment is registered in the journal's state while a reader
//! holds it ([`Holding`]), so compaction can tell the segments nobody reads
//! any more. Used by the stager (live) and by replay at startup.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use crate::event::StateId;

use super::segment::{self, RecordHeader, HEADER_LEN, MAX_PAYLOAD, RECORD_HEADER_LEN};
use super::{JournalError, Record, Shared, State};

/// Read buffer for segment files: large enough that catching up costs few
/// syscalls, small enough for a handful of followers.
const READ_BUFFER_BYTES: usize = 1 << 20;

/// An ordered reader of durable records; `Send`, so it can live on its own
/// thread or task.
pub struct Follower {
    shared: Arc<Shared>,
    /// Id of the last record returned (or the starting point).
    cursor: StateId,
    from_files: bool,
    /// Kept while the follower reads the ring, so falling behind again in
    /// the same segment continues from here instead of rescanning it.
    reader: Option<SegmentReader>,
}

/// How long a read may wait for a record to become durable.
#[derive(Clone, Copy)]
enum Wait {
    No,
    Until(Instant),
    Forever,
}

/// What to do with segment files, decided under the lock, done outside it.
enum FileStep {
    /// The current reader has durable bytes left.
    Read,
    /// Open this segment and scan it for the first record after the cursor.
    Open { first_id: StateId, limit: u64 },
}

impl Follower {
    pub(super) fn new(shared: Arc<Shared>, after: StateId) -> Follower {
        let from_files = after.0 < shared.ring_base.load(Ordering::Acquire);
        Follower {
            shared,
            cursor: after,
            from_files,
            reader: None,
        }
    }

    /// The next record after the cursor, waiting up to `timeout` for one to
    /// become durable. `Ok(None)` on timeout or once the journal is closed.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Arc<Record>>, JournalError> {
        let wait = match Instant::now().checked_add(timeout) {
            Some(deadline) => Wait::Until(deadline),
            None => Wait::Forever,
        };
        self.next(wait)
    }

    /// The next durable record after the cursor, without waiting.
    pub fn try_next(&mut self) -> Result<Option<Arc<Record>>, JournalError> {
        self.next(Wait::No)
    }

    /// Id of the last record returned, or the starting point.
    pub fn position(&self) -> StateId {
        self.cursor
    }

    /// True while the follower is behind the ring and reads segment files.
    pub fn reading_from_files(&self) -> bool {
        self.from_files
    }

    fn next(&mut self, wait: Wait) -> Result<Option<Arc<Record>>, JournalError> {
        loop {
            // Fast path while behind: no lock per record, only the atomic
            // ring base to notice when the ring has the next record.
            if self.from_files && !self.shared.closed.load(Ordering::Acquire) {
                if let Some(reader) = self.reader.as_mut() {
                    if let Some(record) = reader.read_next(self.cursor)? {
                        self.cursor = record.id;
                        self.shared.stats.file_reads.fetch_add(1, Ordering::Relaxed);
                        if self.cursor.0 >= self.shared.ring_base.load(Ordering::Acquire) {
                            self.from_files = false;
                        }
                        return Ok(Some(record));
                    }
                }
            }

            let mut st = self.shared.lock();
            if st.closed {
                return Ok(None);
            }
            if self.cursor >= st.ring_base {
                self.from_files = false;
                let idx = st.ring.partition_point(|r| r.id <= self.cursor);
                if let Some(record) = st.ring.get(idx) {
                    let record = Arc::clone(record);
                    self.cursor = record.id;
                    self.shared.stats.ring_reads.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(record));
                }
                let timeout = match wait {
                    Wait::No => return Ok(None),
                    Wait::Forever => Duration::from_secs(3600),
                    Wait::Until(deadline) => {
                        let now = Instant::now();
                        if now >= deadline {
                            return Ok(None);
                        }
                        deadline - now
                    }
                };
                // Loop after waking: the record may have arrived, the ring may
                // have moved past us, or the journal may have closed.
                drop(
                    self.shared
                        .published
                        .wait_timeout(st, timeout)
                        .unwrap_or_else(PoisonError::into_inner),
                );
                continue;
            }

            // Behind the ring: the next record is durable and in the files.
            self.from_files = true;
            let Some(k) = st.segment_for(self.cursor) else {
                return Err(self.inconsistent(&format!(
                    "no segment although the ring starts after {}",
                    st.ring_base
                )));
            };
            let seg = st.segments[k];
            let step = match self.reader.as_mut() {
                Some(r) if r.first_id == seg.first_id && r.after <= self.cursor => {
                    if seg.len > r.limit {
                        r.extend_limit(seg.len);
                    }
                    if r.pos < r.limit {
                        FileStep::Read
                    } else {
                        // Every record of this segment up to its durable end
                        // is at or before the cursor: the next is further on.
                        match st.segments.get(k + 1) {
                            Some(next) => FileStep::Open {
                                first_id: next.first_id,
                                limit: next.len,
                            },
                            None => {
                                return Err(self.inconsistent(&format!(
                                    "no durable record after {} although the ring starts after {}",
                                    self.cursor, st.ring_base
                                )))
                            }
                        }
                    }
                }
                _ => FileStep::Open {
                    first_id: seg.first_id,
                    limit: seg.len,
                },
            };
            // Registered before the lock is released, while the segment
            // is still in the index.
            let open = match step {
                FileStep::Open { first_id, limit } => Some((
                    first_id,
                    limit,
                    Holding::new(&mut st, &self.shared, first_id),
                )),
                FileStep::Read => None,
            };
            drop(st);
            if let Some((first_id, limit, holding)) = open {
                self.reader = Some(SegmentReader::open(
                    &self.shared.dir,
                    first_id,
                    limit,
                    self.cursor,
                    holding,
                )?);
            }
        }
    }

    fn inconsistent(&self, what: &str) -> JournalError {
        JournalError::Corrupt {
            path: self.shared.dir.clone(),
            offset: 0,
            reason: format!("journal index inconsistent: {what}"),
        }
    }
}

/// A segment registered as open by a reader, from before it is opened
/// (under the journal lock, while the segment is still in the index) until
/// the reader is dropped.
struct Holding {
    shared: Arc<Shared>,
    first_id: StateId,
}

impl Holding {
    fn new(st: &mut State, shared: &Arc<Shared>, first_id: StateId) -> Holding {
        *st.open_readers.entry(first_id).or_insert(0) += 1;
        Holding {
            shared: Arc::clone(shared),
            first_id,
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(n) = st.open_readers.get_mut(&self.first_id) {
            *n -= 1;
            if *n == 0 {
                st.open_readers.remove(&self.first_id);
            }
        }
    }
}

/// Sequential reader of one segment, bounded by its durable length.
struct SegmentReader {
    first_id: StateId,
    path: PathBuf,
    reader: BufReader<File>,
    /// Offset of the next record.
    pos: u64,
    /// Durable length when last looked up; never read past it.
    limit: u64,
    /// Every record before `pos` has an id at or below this.
    after: StateId,
    /// Set when `limit` grew: the buffer may hold bytes read while they were
    /// beyond the old limit (possibly half-written), so refill from `pos`.
    refill: bool,
    _holding: Holding,
}

impl SegmentReader {
    fn open(
        dir: &std::path::Path,
        first_id: StateId,
        limit: u64,
        after: StateId,
        holding: Holding,
    ) -> Result<SegmentReader, JournalError> {
        let path = segment::segment_path(dir, first_id);
        let file = File::open(&path)
            .map_err(|e| JournalError::io("open journal segment for reading", &path, e))?;
        let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, file);
        let mut header = [0u8; HEADER_LEN as usize];
        reader
            .read_exact(&mut header)
            .map_err(|e| JournalError::io("read journal segment header", &path, e))?;
        if let Some(reason) = segment::header_problem(&header) {
            return Err(JournalError::Corrupt {
                path,
                offset: 0,
                reason,
            });
        }
        Ok(SegmentReader {
            first_id,
            path,
            reader,
            pos: HEADER_LEN,
            limit,
            after,
            refill: false,
            _holding: holding,
        })
    }

    fn extend_limit(&mut self, limit: u64) {
        self.limit = limit;
        self.refill = true;
    }

    /// The next record with id > `cursor` below the durable limit; records
    /// at or below `cursor` are skipped without copying their payloads.
    fn read_next(&mut self, cursor: StateId) -> Result<Option<Arc<Record>>, JournalError> {
        if self.refill && self.pos < self.limit {
            self.reader
                .seek(SeekFrom::Start(self.pos))
                .map_err(|e| JournalError::io("seek journal segment", &self.path, e))?;
            self.refill = false;
        }
        while self.pos < self.limit {
            let offset = self.pos;
            if self.limit - offset < RECORD_HEADER_LEN as u64 {
                return Err(self.corrupt(
                    offset,
                    "durable length ends inside a record header".to_string(),
                ));
            }
            let mut rh = [0u8; RECORD_HEADER_LEN];
            self.reader
                .read_exact(&mut rh)
                .map_err(|e| self.read_error(e))?;
            let h = RecordHeader::decode(&rh);
            if h.len > MAX_PAYLOAD || self.limit - offset < h.framed_len() {
                return Err(self.corrupt(
                    offset,
                    format!("record length {} runs past the durable end", h.len),
                ));
            }
            self.pos += h.framed_len();
            if h.id <= cursor {
                self.reader
                    .seek_relative(h.len as i64)
                    .map_err(|e| JournalError::io("seek journal segment", &self.path, e))?;
                self.after = self.after.max(h.id);
                continue;
            }
            let mut payload = vec![0u8; h.len];
            self.reader
                .read_exact(&mut payload)
                .map_err(|e| self.read_error(e))?;
            if segment::record_crc(h.id, &payload) != h.crc {
                return Err(self.corrupt(offset, format!("CRC mismatch on record {}", h.id)));
            }
            self.after = h.id;
            return Ok(Some(Arc::new(Record { id: h.id, payload })));
        }
        Ok(None)
    }

    fn read_error(&self, e: io::Error) -> JournalError {
        JournalError::io("read journal segment", &self.path, e)
    }

    fn corrupt(&self, offset: u64, reason: String) -> JournalError {
        JournalError::Corrupt {
            path: self.path.clone(),
            offset,
            reason,
        }
    }
}
