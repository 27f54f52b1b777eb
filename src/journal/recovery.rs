//! Journal recovery: runs once in [`Journal::open`](super::Journal::open),
//! before any writer or follower exists.
//!
//! Scans every segment in order and checks headers, lengths, CRCs, that ids
//! strictly increase and that each segment's first record matches its name.
//! Only the *tail of the last segment* can be torn by a crash: the writer
//! fdatasyncs a segment before it starts the next one, so a bad record
//! anywhere else is corruption, not a torn write. Hence:
//! - a bad or torn record in the last segment is cut (the segment is
//!   truncated at that record's start and fsynced, or removed when no record
//!   survives), so a torn tail is never replayed and the surviving journal is
//!   a clean prefix;
//! - but never below `durable_through`: a cut that would drop a record the
//!   commit record says is committed (at or below that id) stops with
//!   [`JournalError::CutBelowCommit`] instead;
//! - a bad record, torn header or record-less segment before the last
//!   segment stops with [`JournalError::CorruptBeforeTail`].
//!
//! Every check runs before anything is changed: when recovery stops with an
//! error, every file is as it was (nothing truncated, nothing deleted), for
//! the operator to inspect or restore. A last segment without records (a
//! crash between creating a segment and writing to it) is removed so the
//! next segment's name matches its first record.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::durable::fsync_dir;
use crate::event::StateId;

use super::segment::{self, RecordHeader, HEADER_LEN, MAX_PAYLOAD, RECORD_HEADER_LEN};
use super::{JournalError, RecoveryReport, SegmentInfo};

/// What recovery leaves behind: the surviving segments and what it did.
pub(super) struct Recovered {
    pub segments: Vec<SegmentInfo>,
    pub report: RecoveryReport,
}

/// How a segment scan ended.
enum ScanEnd {
    /// Every byte belongs to a valid record.
    Clean,
    /// The record (or header) at `offset` is bad; nothing from there on counts.
    Bad { offset: u64, reason: String },
}

struct Scan {
    /// Bytes of valid header plus records.
    valid_len: u64,
    file_len: u64,
    end: ScanEnd,
}

/// Recovers the journal in `dir`. `durable_through` is the newest id the
/// caller knows to be committed (the commit record's visible state): no
/// record at or below it may be cut.
pub(super) fn recover(
    dir: &Path,
    durable_through: StateId,
    cancel: Option<fn() -> bool>,
) -> Result<Recovered, JournalError> {
    if !dir.is_dir() {
        fs::create_dir_all(dir)
            .map_err(|e| JournalError::io("create journal directory", dir, e))?;
        // The directory's own entry must be durable before segments in it
        // can be.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fsync_dir(parent)
                .map_err(|e| JournalError::io("fsync parent of journal directory", parent, e))?;
        }
    }
    // A compaction cut short by a crash: its records are below the floor.
    segment::remove_leftover_removals(dir)?;
    let found = segment::list_segments(dir)?;

    let mut report = RecoveryReport::default();
    let mut segments = Vec::with_capacity(found.len());
    // Decided while scanning, done only once every segment checked out.
    let mut tail_cut: Option<TailCut> = None;

    for (i, (first_id, path)) in found.iter().enumerate() {
        let is_last = i + 1 == found.len();
        let scan = scan_segment(path, *first_id, &mut report, cancel)?;
        match scan.end {
            ScanEnd::Clean if scan.valid_len > HEADER_LEN => segments.push(SegmentInfo {
                first_id: *first_id,
                len: scan.valid_len,
            }),
            ScanEnd::Clean if is_last => {
                tracing::debug!(segment = %path.display(), "removing journal segment without records");
                tail_cut = Some(TailCut {
                    path: path.clone(),
                    offset: 0,
                    file_len: scan.file_len,
                    reason: None,
                });
            }
            ScanEnd::Clean => {
                return Err(JournalError::CorruptBeforeTail {
                    path: path.clone(),
                    offset: HEADER_LEN,
                    reason: "a segment without records".to_owned(),
                })
            }
            ScanEnd::Bad { offset, reason } if !is_last => {
                return Err(JournalError::CorruptBeforeTail {
                    path: path.clone(),
                    offset,
                    reason,
                })
            }
            ScanEnd::Bad { offset, reason } => {
                let last_intact = report.last_id.unwrap_or_default();
                if last_intact < durable_through {
                    return Err(JournalError::CutBelowCommit {
                        path: path.clone(),
                        offset,
                        reason,
                        last_intact,
                        durable: durable_through,
                    });
                }
                if offset > HEADER_LEN {
                    segments.push(SegmentInfo {
                        first_id: *first_id,
                        len: offset,
                    });
                }
                tail_cut = Some(TailCut {
                    path: path.clone(),
                    offset,
                    file_len: scan.file_len,
                    reason: Some(reason),
                });
            }
        }
    }
    if let Some(cut) = tail_cut {
        cut.apply(dir, &mut report)?;
    }
    Ok(Recovered { segments, report })
}

/// The one change recovery may make: cut the last segment at `offset`
/// (removing it when no record survives).
struct TailCut {
    path: PathBuf,
    offset: u64,
    file_len: u64,
    /// Why; `None` for a segment that simply holds no records.
    reason: Option<String>,
}

impl TailCut {
    fn apply(self, dir: &Path, report: &mut RecoveryReport) -> Result<(), JournalError> {
        let TailCut {
            path,
            offset,
            file_len,
            reason,
        } = self;
        if offset <= HEADER_LEN {
            // No record survives: the whole file goes, header included.
            fs::remove_file(&path)
                .map_err(|e| JournalError::io("remove journal segment", &path, e))?;
            fsync_dir(dir).map_err(|e| JournalError::io("fsync journal directory", dir, e))?;
        } else {
            truncate(&path, offset)?;
        }
        let Some(reason) = reason else {
            return Ok(());
        };
        let cut = if offset <= HEADER_LEN {
            file_len
        } else {
            file_len - offset
        };
        let reason = format!("{reason} in {} at offset {offset}", path.display());
        tracing::warn!(
            segment = %path.display(),
            offset,
            truncated_bytes = cut,
            %reason,
            "journal tail is torn; truncating it"
        );
        report.truncated_bytes = cut;
        report.reason = Some(reason);
        Ok(())
    }
}

/// Validates one segment, counting its good records into `report`.
fn scan_segment(
    path: &Path,
    first_id: StateId,
    report: &mut RecoveryReport,
    cancel: Option<fn() -> bool>,
) -> Result<Scan, JournalError> {
    if cancel.is_some_and(|c| c()) {
        return Err(JournalError::Cancelled);
    }
    let file = File::open(path).map_err(|e| JournalError::io("open journal segment", path, e))?;
    let file_len = file
        .metadata()
        .map_err(|e| JournalError::io("stat journal segment", path, e))?
        .len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let read_err = |e: io::Error| JournalError::io("read journal segment", path, e);
    let bad = |offset: u64, reason: String| Scan {
        valid_len: offset,
        file_len,
        end: ScanEnd::Bad { offset, reason },
    };

    if file_len < HEADER_LEN {
        return Ok(bad(0, "torn segment header".to_string()));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    reader.read_exact(&mut header).map_err(read_err)?;
    if let Some(problem) = segment::header_problem(&header) {
        return Ok(bad(0, problem));
    }

    let mut pos = HEADER_LEN;
    let mut payload = Vec::new();
    let mut first_in_segment = true;
    while pos < file_len {
        if report.records % 65_536 == 65_535 && cancel.is_some_and(|c| c()) {
            return Err(JournalError::Cancelled);
        }
        if file_len - pos < RECORD_HEADER_LEN as u64 {
            return Ok(bad(pos, "torn record header".to_string()));
        }
        let mut rh = [0u8; RECORD_HEADER_LEN];
        reader.read_exact(&mut rh).map_err(read_err)?;
        let h = RecordHeader::decode(&rh);
        if h.len > MAX_PAYLOAD {
            return Ok(bad(
                pos,
                format!("record length {} exceeds the limit", h.len),
            ));
        }
        if file_len - pos < h.framed_len() {
            return Ok(bad(pos, "torn record".to_string()));
        }
        payload.resize(h.len, 0);
        reader.read_exact(&mut payload).map_err(read_err)?;
        if segment::record_crc(h.id, &payload) != h.crc {
            return Ok(bad(pos, format!("CRC mismatch on record {}", h.id)));
        }
        if let Some(last) = report.last_id {
            if h.id <= last {
                return Ok(bad(pos, format!("record {} does not follow {last}", h.id)));
            }
        }
        if first_in_segment && h.id != first_id {
            return Ok(bad(
                pos,
                format!("first record {} does not match the segment name", h.id),
            ));
        }
        first_in_segment = false;
        report.records += 1;
        report.last_id = Some(h.id);
        pos += h.framed_len();
    }
    Ok(Scan {
        valid_len: pos,
        file_len,
        end: ScanEnd::Clean,
    })
}

fn truncate(path: &Path, len: u64) -> Result<(), JournalError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| JournalError::io("open journal segment for truncation", path, e))?;
    file.set_len(len)
        .map_err(|e| JournalError::io("truncate journal segment", path, e))?;
    file.sync_all()
        .map_err(|e| JournalError::io("fsync truncated journal segment", path, e))
}
