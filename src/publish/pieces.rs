//! The piece list of a large file (`pieces/<sha256>`): its size, the
//! piece size and each piece's sha256, every piece a blob of its own.
//!
//! ```text
//! "STGFSP01" | size u64 | piece_size u32 | count u32 | count × sha256
//! ```
//!
//! little-endian. The list is named by its own sha256 and each piece by
//! its sha256, so a reader verifies every byte it serves piece by piece,
//! and the whole file's sha256 (in the catalog) once it has every piece.

use crate::event::BlobId;

const MAGIC: &[u8; 8] = b"STGFSP01";
/// Pieces smaller than this are refused (a list of millions of tiny
/// pieces would cost a reader more than the file).
pub const MIN_PIECE_SIZE: u32 = 64 << 10;
/// At most this many pieces (at 8 MiB, files up to 8 TiB).
pub const MAX_PIECES: u32 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceList {
    pub size: u64,
    pub piece_size: u32,
    pub pieces: Vec<BlobId>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PiecesError {
    #[error("not a piece list: {0}")]
    Malformed(String),
}

impl PieceList {
    /// The byte range of piece `i` within the file.
    pub fn range(&self, i: usize) -> std::ops::Range<u64> {
        let start = i as u64 * u64::from(self.piece_size);
        start..(start + u64::from(self.piece_size)).min(self.size)
    }

    /// The index of the piece holding byte `offset`.
    pub fn piece_at(&self, offset: u64) -> usize {
        (offset / u64::from(self.piece_size)) as usize
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 32 * self.pieces.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.piece_size.to_le_bytes());
        out.extend_from_slice(&(self.pieces.len() as u32).to_le_bytes());
        for p in &self.pieces {
            out.extend_from_slice(&p.0);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<PieceList, PiecesError> {
        let bad = |m: &str| PiecesError::Malformed(m.to_owned());
        if bytes.len() < 24 || &bytes[..8] != MAGIC {
            return Err(bad("no STGFSP01 header"));
        }
        let size = u64::from_le_bytes(bytes[8..16].try_into().map_err(|_| bad("size"))?);
        let piece_size =
            u32::from_le_bytes(bytes[16..20].try_into().map_err(|_| bad("piece size"))?);
        let count = u32::from_le_bytes(bytes[20..24].try_into().map_err(|_| bad("count"))?);
        if piece_size < MIN_PIECE_SIZE {
            return Err(bad("piece size below 64 KiB"));
        }
        if count == 0 || count > MAX_PIECES {
            return Err(bad("piece count out of range"));
        }
        // Every piece but the last is whole, the last is not empty.
        let full = u64::from(count - 1) * u64::from(piece_size);
        if size <= full || size - full > u64::from(piece_size) {
            return Err(bad("size does not match the piece count"));
        }
        let body = &bytes[24..];
        if body.len() != count as usize * 32 {
            return Err(bad("length does not match the piece count"));
        }
        let pieces = body
            .chunks_exact(32)
            .map(|c| {
                let mut id = [0u8; 32];
                id.copy_from_slice(c);
                BlobId(id)
            })
            .collect();
        Ok(PieceList {
            size,
            piece_size,
            pieces,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(size: u64, piece: u32) -> PieceList {
        let n = size.div_ceil(u64::from(piece));
        PieceList {
            size,
            piece_size: piece,
            pieces: (0..n).map(|i| BlobId([i as u8; 32])).collect(),
        }
    }

    #[test]
    fn piece_lists_round_trip_and_ranges_cover_the_file() {
        for (size, piece) in [
            (1, 65536),
            (65536, 65536),
            (65537, 65536),
            (10 << 20, 1 << 20),
        ] {
            let l = list(size, piece);
            assert_eq!(PieceList::decode(&l.encode()).unwrap(), l);
            let mut end = 0;
            for i in 0..l.pieces.len() {
                let r = l.range(i);
                assert_eq!(r.start, end);
                assert_eq!(l.piece_at(r.start), i);
                end = r.end;
            }
            assert_eq!(end, size);
        }
    }

    #[test]
    fn inconsistent_piece_lists_are_refused() {
        let good = list(200_000, 65536).encode();
        let mut short = good.clone();
        short.pop();
        let mut wrong_size = good.clone();
        wrong_size[8..16].copy_from_slice(&(65536u64 * 4 + 1).to_le_bytes());
        let mut tiny = good.clone();
        tiny[16..20].copy_from_slice(&1024u32.to_le_bytes());
        let mut huge = good.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        for bad in [
            &short[..],
            &wrong_size,
            &tiny,
            &huge,
            &good[..10],
            b"STGFSP02",
        ] {
            assert!(PieceList::decode(bad).is_err());
        }
    }
}
