//! Journal recovery: runs once in [`Journal::open`](super::Journal::open),
//! before any writer or follower exists.
//!
//! Scans every segment in order and checks headers, lengths, CRCs, that ids
//! strictly increase and that each segment's first record matches its name.
//! At the first bad or torn record the segment is truncated at that record's
//! start (fsynced) and every later segment is deleted (directory fsynced), so
//! a torn tail is never replayed and the surviving journal is a clean prefix.
//! Segments with no records (a crash between creating a segment and writing
//! to it) are deleted so the next segment's name matches its first record.

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

pub(super) fn recover(dir: &Path) -> Result<Recovered, JournalError> {
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
    let found = segment::list_segments(dir)?;

    let mut report = RecoveryReport::default();
    let mut segments = Vec::with_capacity(found.len());
    let mut dir_changed = false;

    for (i, (first_id, path)) in found.iter().enumerate() {
        let scan = scan_segment(path, *first_id, &mut report)?;
        match scan.end {
            ScanEnd::Clean if scan.valid_len <= HEADER_LEN => {
                tracing::debug!(segment = %path.display(), "removing journal segment without records");
                remove(path)?;
                dir_changed = true;
            }
            ScanEnd::Clean => segments.push(SegmentInfo {
                first_id: *first_id,
                len: scan.valid_len,
            }),
            ScanEnd::Bad { offset, reason } => {
                let mut cut = scan.file_len - offset;
                if offset <= HEADER_LEN {
                    // No record survives: the whole file goes, header included.
                    cut = scan.file_len;
                    remove(path)?;
                    dir_changed = true;
                } else {
                    truncate(path, offset)?;
                    segments.push(SegmentInfo {
                        first_id: *first_id,
                        len: offset,
                    });
                }
                let later = &found[i + 1..];
                for (_, later_path) in later {
                    cut += fs::metadata(later_path)
                        .map_err(|e| JournalError::io("stat journal segment", later_path, e))?
                        .len();
                    remove(later_path)?;
                    dir_changed = true;
                }
                let reason = format!("{reason} in {} at offset {offset}", path.display());
                tracing::warn!(
                    segment = %path.display(),
                    offset,
                    truncated_bytes = cut,
                    later_segments_removed = later.len(),
                    %reason,
                    "journal tail is torn or corrupt; truncating it"
                );
                report.truncated_bytes = cut;
                report.reason = Some(reason);
                break;
            }
        }
    }
    if dir_changed {
        fsync_dir(dir).map_err(|e| JournalError::io("fsync journal directory", dir, e))?;
    }
    Ok(Recovered { segments, report })
}

/// Validates one segment, counting its good records into `report`.
fn scan_segment(
    path: &Path,
    first_id: StateId,
    report: &mut RecoveryReport,
) -> Result<Scan, JournalError> {
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

fn remove(path: &PathBuf) -> Result<(), JournalError> {
    fs::remove_file(path).map_err(|e| JournalError::io("remove journal segment", path, e))
}
