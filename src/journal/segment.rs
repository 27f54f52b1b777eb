//! The on-disk format of journal segments: file names, the segment header and
//! the record framing. Pure encoding and decoding plus directory listing; the
//! writer (`journal`), recovery and followers share it so the format lives in
//! exactly one place.
//!
//! Segment file: `{first_id:020}.seg`, starting with [`HEADER_LEN`] bytes
//! (`STGFSJ01`, version `u32 LE`, reserved `u32` zero), then records:
//! `len: u32 LE | crc32c(id LE ++ payload): u32 LE | id: u64 LE | payload`.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::event::StateId;

use super::JournalError;

/// Identifies a stagefs journal segment; the digits are the format generation.
pub(super) const MAGIC: &[u8; 8] = b"STGFSJ01";
/// Layout version inside generation 01; bumped on compatible header changes.
pub(super) const VERSION: u32 = 1;
/// Bytes before the first record of a segment.
pub(super) const HEADER_LEN: u64 = 16;
/// Bytes before a record's payload: len, crc, id.
pub(super) const RECORD_HEADER_LEN: usize = 16;
/// Largest payload a record may carry; bounds what a corrupt length field can
/// make a reader allocate.
pub const MAX_PAYLOAD: usize = 64 << 20;

const SUFFIX: &str = ".seg";
const NAME_DIGITS: usize = 20;

/// Path of the segment whose first record is `first`.
pub(super) fn segment_path(dir: &Path, first: StateId) -> PathBuf {
    dir.join(format!("{:020}{SUFFIX}", first.0))
}

/// The first id encoded in a segment file name, or `None` for any other file
/// (temp files, editor droppings) so stray files never become segments.
pub(super) fn parse_segment_name(name: &OsStr) -> Option<StateId> {
    let name = name.to_str()?;
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.len() != NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(StateId)
}

/// Where compaction renames a segment it cuts in steps: not a segment
/// name, so nothing reads it as one if a crash leaves it behind.
pub(super) fn removing_path(segment: &Path) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(REMOVING_SUFFIX);
    PathBuf::from(name)
}

const REMOVING_SUFFIX: &str = ".removing";

/// Removes what an interrupted compaction left (see [`removing_path`]);
/// every record in such a file is at or below the compaction floor.
pub(super) fn remove_leftover_removals(dir: &Path) -> Result<(), JournalError> {
    let entries =
        fs::read_dir(dir).map_err(|e| JournalError::io("list journal directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| JournalError::io("list journal directory", dir, e))?;
        let name = entry.file_name();
        let is_leftover = name
            .to_str()
            .and_then(|n| n.strip_suffix(REMOVING_SUFFIX))
            .is_some_and(|seg| parse_segment_name(OsStr::new(seg)).is_some());
        if !is_leftover {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(JournalError::io(
                    "remove an interrupted compaction's segment",
                    &path,
                    e,
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Segment files in `dir`, ordered by first id.
pub(super) fn list_segments(dir: &Path) -> Result<Vec<(StateId, PathBuf)>, JournalError> {
    let entries =
        fs::read_dir(dir).map_err(|e| JournalError::io("list journal directory", dir, e))?;
    let mut segments = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| JournalError::io("list journal directory", dir, e))?;
        if let Some(first) = parse_segment_name(&entry.file_name()) {
            segments.push((first, entry.path()));
        }
    }
    segments.sort_by_key(|(first, _)| *first);
    Ok(segments)
}

pub(super) fn encode_header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// Why a segment header is unusable, or `None` if it is fine.
pub(super) fn header_problem(h: &[u8; HEADER_LEN as usize]) -> Option<String> {
    if &h[..8] != MAGIC {
        return Some("bad segment magic".to_string());
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if version != VERSION {
        return Some(format!("unsupported segment version {version}"));
    }
    None
}

pub(super) fn record_crc(id: StateId, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&id.0.to_le_bytes()), payload)
}

/// Appends one framed record to `buf`.
pub(super) fn encode_record(buf: &mut Vec<u8>, id: StateId, payload: &[u8]) {
    // Callers reject larger payloads first; the cast cannot truncate.
    debug_assert!(payload.len() <= MAX_PAYLOAD);
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&record_crc(id, payload).to_le_bytes());
    buf.extend_from_slice(&id.0.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// The fixed-size part of a record.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecordHeader {
    pub len: usize,
    pub crc: u32,
    pub id: StateId,
}

impl RecordHeader {
    pub fn decode(h: &[u8; RECORD_HEADER_LEN]) -> RecordHeader {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&h[8..16]);
        RecordHeader {
            len,
            crc,
            id: StateId(u64::from_le_bytes(id)),
        }
    }

    /// Header plus payload.
    pub fn framed_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + self.len as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip_and_reject_strays() {
        let dir = Path::new("/j");
        let p = segment_path(dir, StateId(42));
        assert_eq!(p, Path::new("/j/00000000000000000042.seg"));
        assert_eq!(
            parse_segment_name(p.file_name().unwrap()),
            Some(StateId(42))
        );
        for stray in [
            "42.seg",
            "0000000000000000004x.seg",
            "00000000000000000042.seg.tmp",
            "x",
        ] {
            assert_eq!(parse_segment_name(OsStr::new(stray)), None, "{stray}");
        }
    }

    #[test]
    fn record_header_decodes_what_encode_wrote() {
        let mut buf = Vec::new();
        encode_record(&mut buf, StateId(7), b"hello");
        let h = RecordHeader::decode(buf[..RECORD_HEADER_LEN].try_into().unwrap());
        assert_eq!(h.len, 5);
        assert_eq!(h.id, StateId(7));
        assert_eq!(h.crc, record_crc(StateId(7), b"hello"));
        assert_eq!(h.framed_len(), buf.len() as u64);
        assert_eq!(header_problem(&encode_header()), None);
    }
}
