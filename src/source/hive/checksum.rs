//! HDFS file checksums, recomputed from a file's bytes in one pass so the
//! stager can verify what it copies against the checksum Hive put in the
//! file URI (`path#checksum#cmroot#subdir`).
//!
//! The checksum is the hex of Hadoop's `FileChecksum.getBytes()`:
//! - MD5-of-MD5-of-CRC (`MD5MD5CRC32FileChecksum`, the default): 28 bytes,
//!   `bytesPerCRC` (int32 BE) + `crcPerBlock` (int64 BE) + MD5 (16 bytes).
//!   A CRC of every `bytesPerCRC` chunk (the last one may be short), an MD5
//!   over each block's CRCs (big-endian u32s), and an MD5 over the block
//!   MD5s. Two details of Hadoop's `FileChecksumHelper` matter:
//!   * `crcPerBlock` is only set for files of more than one block; a
//!     single-block file reports 0, so 0 means "one block, however long".
//!     Otherwise the block size is `crcPerBlock × bytesPerCRC`.
//!   * the file MD5 is taken over the whole backing array of a
//!     `DataOutputBuffer` (`MD5Hash.digest(buf.getData())`), which starts at
//!     32 bytes and doubles: the block MD5s are followed by zeros up to the
//!     smallest 32·2^k ≥ 16·blocks. An empty file has no blocks and gets the
//!     fixed value `MD5MD5CRC32GzipFileChecksum(0, 0, MD5(32 zero bytes))`.
//! - COMPOSITE-CRC (`dfs.checksum.combine.mode=COMPOSITE_CRC`): 4 bytes, the
//!   CRC of the whole file (block CRCs composed are the CRC of the stream).
//!
//! `getBytes()` does not say which CRC the cluster used (CRC32C by default,
//! CRC32 — the gzip polynomial — on older clusters), so a checksummer made
//! by [`HdfsChecksummer::for_expected`] computes both in the same pass and
//! [`ChecksumVerifier`] accepts the one that matches;
//! [`ChecksumVerifier::with_types`] computes only the types asked for (the
//! stager asks for CRC32C, and for CRC32 in a second pass over the stored
//! copy only when CRC32C did not match: [`checksum_check`]). Tests check this
//! against values published by independent implementations
//! (tests/hive_decode.rs, scripts/hdfs_checksum_vectors.py).
//!
//! Pure computation: the stager feeds bytes while copying.

use md5::{Digest, Md5};

use crate::event::Verify;
use crate::stage;

/// Which CRC the cluster's `dfs.checksum.type` was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CrcType {
    /// Castagnoli (Hadoop's default since 2.0).
    Crc32c,
    /// The gzip/zlib polynomial (`MD5MD5CRC32GzipFileChecksum`).
    Crc32,
}

impl CrcType {
    pub const BOTH: [CrcType; 2] = [CrcType::Crc32c, CrcType::Crc32];

    pub fn name(self) -> &'static str {
        match self {
            CrcType::Crc32c => "CRC32C",
            CrcType::Crc32 => "CRC32",
        }
    }

    /// Continues a CRC (0 to start) over `data`.
    fn append(self, crc: u32, data: &[u8]) -> u32 {
        match self {
            CrcType::Crc32c => crc32c::crc32c_append(crc, data),
            CrcType::Crc32 => {
                let mut h = crc32fast::Hasher::new_with_initial(crc);
                h.update(data);
                h.finalize()
            }
        }
    }
}

/// An HDFS file checksum as Hive records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HdfsChecksum {
    /// `MD5MD5CRC32FileChecksum` (28 bytes).
    Md5Md5Crc {
        bytes_per_crc: u32,
        /// 0 for a file of at most one block.
        crc_per_block: u64,
        md5: [u8; 16],
    },
    /// `CompositeCrcFileChecksum` (4 bytes).
    CompositeCrc { crc: u32 },
}

/// What is wrong with a checksum string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    #[error("HDFS checksum {hex:?} is not hex")]
    NotHex { hex: String },
    #[error("HDFS checksum {hex:?} has {bytes} bytes; stagefs reads MD5-of-MD5-of-CRC (28 bytes) and COMPOSITE-CRC (4 bytes)")]
    UnknownLength { hex: String, bytes: usize },
    #[error("HDFS checksum {hex:?}: {reason}")]
    BadValue { hex: String, reason: String },
}

impl HdfsChecksum {
    /// What Hadoop reports for an empty file.
    pub fn empty_file() -> HdfsChecksum {
        HdfsChecksum::Md5Md5Crc {
            bytes_per_crc: 0,
            crc_per_block: 0,
            md5: Md5::digest([0u8; 32]).into(),
        }
    }

    /// Parses the hex of `getBytes()` (either case).
    pub fn from_hex(hex: &str) -> Result<HdfsChecksum, ChecksumError> {
        let bytes = decode_hex(hex).ok_or_else(|| ChecksumError::NotHex {
            hex: hex.to_string(),
        })?;
        match bytes.len() {
            28 => {
                let mut bpc = [0u8; 4];
                let mut cpb = [0u8; 8];
                let mut md5 = [0u8; 16];
                bpc.copy_from_slice(&bytes[0..4]);
                cpb.copy_from_slice(&bytes[4..12]);
                md5.copy_from_slice(&bytes[12..28]);
                let bad = |reason: String| ChecksumError::BadValue {
                    hex: hex.to_string(),
                    reason,
                };
                let bpc = i32::from_be_bytes(bpc);
                let cpb = i64::from_be_bytes(cpb);
                let bytes_per_crc =
                    u32::try_from(bpc).map_err(|_| bad(format!("negative bytesPerCRC {bpc}")))?;
                let crc_per_block =
                    u64::try_from(cpb).map_err(|_| bad(format!("negative crcPerBlock {cpb}")))?;
                if bytes_per_crc == 0 && crc_per_block != 0 {
                    return Err(bad(format!(
                        "bytesPerCRC 0 with crcPerBlock {crc_per_block}"
                    )));
                }
                Ok(HdfsChecksum::Md5Md5Crc {
                    bytes_per_crc,
                    crc_per_block,
                    md5,
                })
            }
            4 => Ok(HdfsChecksum::CompositeCrc {
                crc: u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            }),
            n => Err(ChecksumError::UnknownLength {
                hex: hex.to_string(),
                bytes: n,
            }),
        }
    }

    /// Lower-case hex of `getBytes()`, as Hive writes it.
    pub fn to_hex(&self) -> String {
        let mut bytes = Vec::with_capacity(28);
        match self {
            HdfsChecksum::Md5Md5Crc {
                bytes_per_crc,
                crc_per_block,
                md5,
            } => {
                bytes.extend_from_slice(&bytes_per_crc.to_be_bytes());
                bytes.extend_from_slice(&crc_per_block.to_be_bytes());
                bytes.extend_from_slice(md5);
            }
            HdfsChecksum::CompositeCrc { crc } => bytes.extend_from_slice(&crc.to_be_bytes()),
        }
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    let h = hex.as_bytes();
    if h.len() % 2 != 0 {
        return None;
    }
    h.chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            Some((hi * 16 + lo) as u8)
        })
        .collect()
}

/// How the bytes are cut and combined.
#[derive(Debug, Clone, Copy)]
enum Layout {
    Md5Md5 {
        bytes_per_crc: u32,
        /// 0: the whole file is one block.
        crc_per_block: u64,
    },
    Composite,
}

/// The running state for one CRC type.
#[derive(Clone)]
struct Lane {
    ty: CrcType,
    /// CRC of the current chunk (Md5Md5) or of everything so far (Composite).
    crc: u32,
    block_md5: Md5,
    file_md5: Md5,
}

/// Computes HDFS checksums of a byte stream in one pass, for one or both
/// CRC types. Feed with [`update`](Self::update) in pieces of any size.
#[derive(Clone)]
pub struct HdfsChecksummer {
    layout: Layout,
    lanes: Vec<Lane>,
    total: u64,
    /// Bytes in the current chunk.
    chunk_fill: u32,
    /// CRCs in the current block.
    crcs_in_block: u64,
    /// Blocks whose MD5 went into the file MD5.
    blocks: u64,
}

impl HdfsChecksummer {
    /// A checksummer shaped like `expected` (its bytesPerCRC and
    /// crcPerBlock), computing both CRC types.
    pub fn for_expected(expected: &HdfsChecksum) -> HdfsChecksummer {
        HdfsChecksummer::new(expected, &CrcType::BOTH)
    }

    /// Like [`for_expected`](Self::for_expected) for the given CRC types only.
    pub fn new(expected: &HdfsChecksum, types: &[CrcType]) -> HdfsChecksummer {
        let layout = match *expected {
            HdfsChecksum::Md5Md5Crc {
                bytes_per_crc,
                crc_per_block,
                ..
            } => Layout::Md5Md5 {
                bytes_per_crc,
                crc_per_block,
            },
            HdfsChecksum::CompositeCrc { .. } => Layout::Composite,
        };
        let mut lanes: Vec<Lane> = Vec::new();
        for &ty in types {
            if !lanes.iter().any(|l| l.ty == ty) {
                lanes.push(Lane {
                    ty,
                    crc: 0,
                    block_md5: Md5::new(),
                    file_md5: Md5::new(),
                });
            }
        }
        HdfsChecksummer {
            layout,
            lanes,
            total: 0,
            chunk_fill: 0,
            crcs_in_block: 0,
            blocks: 0,
        }
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let (bytes_per_crc, crc_per_block) = match self.layout {
            Layout::Composite => {
                for lane in &mut self.lanes {
                    lane.crc = lane.ty.append(lane.crc, data);
                }
                return;
            }
            // Only an empty file can match; the length alone decides.
            Layout::Md5Md5 {
                bytes_per_crc: 0, ..
            } => return,
            Layout::Md5Md5 {
                bytes_per_crc,
                crc_per_block,
            } => (bytes_per_crc, crc_per_block),
        };
        while !data.is_empty() {
            let room = (bytes_per_crc - self.chunk_fill) as usize;
            let take = room.min(data.len());
            let (piece, rest) = data.split_at(take);
            for lane in &mut self.lanes {
                lane.crc = lane.ty.append(lane.crc, piece);
            }
            // take ≤ room ≤ bytes_per_crc, which is a u32.
            self.chunk_fill += take as u32;
            data = rest;
            if self.chunk_fill == bytes_per_crc {
                self.end_chunk();
                if crc_per_block != 0 && self.crcs_in_block == crc_per_block {
                    self.end_block();
                }
            }
        }
    }

    fn end_chunk(&mut self) {
        for lane in &mut self.lanes {
            lane.block_md5.update(lane.crc.to_be_bytes());
            lane.crc = 0;
        }
        self.chunk_fill = 0;
        self.crcs_in_block += 1;
    }

    fn end_block(&mut self) {
        for lane in &mut self.lanes {
            let block = lane.block_md5.finalize_reset();
            lane.file_md5.update(block);
        }
        self.crcs_in_block = 0;
        self.blocks += 1;
    }

    /// The checksum of everything fed, for each CRC type asked for (none
    /// when the layout describes an empty file and bytes were fed).
    pub fn finish(mut self) -> Vec<(CrcType, HdfsChecksum)> {
        if self.total == 0 {
            // Hadoop's fixed value for a file without blocks, whatever the
            // layout; it is a CRC32 ("Gzip") checksum object.
            return vec![(CrcType::Crc32, HdfsChecksum::empty_file())];
        }
        let (bytes_per_crc, crc_per_block) = match self.layout {
            Layout::Composite => {
                return self
                    .lanes
                    .iter()
                    .map(|l| (l.ty, HdfsChecksum::CompositeCrc { crc: l.crc }))
                    .collect()
            }
            Layout::Md5Md5 {
                bytes_per_crc: 0, ..
            } => return Vec::new(),
            Layout::Md5Md5 {
                bytes_per_crc,
                crc_per_block,
            } => (bytes_per_crc, crc_per_block),
        };
        if self.chunk_fill > 0 {
            self.end_chunk();
        }
        if self.crcs_in_block > 0 {
            self.end_block();
        }
        // Zeros after the block MD5s up to the DataOutputBuffer's capacity.
        let used = self.blocks.saturating_mul(16);
        let mut capacity: u64 = 32;
        while capacity < used {
            capacity = capacity.saturating_mul(2);
        }
        let zeros = [0u8; 4096];
        self.lanes
            .into_iter()
            .map(|mut lane| {
                let mut pad = capacity - used;
                while pad > 0 {
                    let n = pad.min(zeros.len() as u64) as usize;
                    lane.file_md5.update(&zeros[..n]);
                    pad -= n as u64;
                }
                (
                    lane.ty,
                    HdfsChecksum::Md5Md5Crc {
                        bytes_per_crc,
                        crc_per_block,
                        md5: lane.file_md5.finalize().into(),
                    },
                )
            })
            .collect()
    }
}

/// The bytes did not give the expected checksum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HDFS checksum mismatch over {size} bytes: expected {expected}, computed {}", computed_list(.computed))]
pub struct ChecksumMismatch {
    pub expected: String,
    /// What the bytes give, per CRC type tried.
    pub computed: Vec<(CrcType, String)>,
    pub size: u64,
}

fn computed_list(computed: &[(CrcType, String)]) -> String {
    if computed.is_empty() {
        return "nothing (the expected checksum is an empty file's)".to_string();
    }
    computed
        .iter()
        .map(|(ty, hex)| format!("{hex} ({})", ty.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a stream against the checksum from a file URI: make it from the
/// URI's hex, feed it every byte while copying, then [`finish`](Self::finish).
#[derive(Clone)]
pub struct ChecksumVerifier {
    expected: HdfsChecksum,
    summer: HdfsChecksummer,
}

impl ChecksumVerifier {
    pub fn from_hex(hex: &str) -> Result<ChecksumVerifier, ChecksumError> {
        Ok(ChecksumVerifier::new(HdfsChecksum::from_hex(hex)?))
    }

    /// Tries both CRC types.
    pub fn new(expected: HdfsChecksum) -> ChecksumVerifier {
        ChecksumVerifier::with_types(expected, &CrcType::BOTH)
    }

    /// Tries the given CRC types only (each costs a CRC of every byte).
    pub fn with_types(expected: HdfsChecksum, types: &[CrcType]) -> ChecksumVerifier {
        ChecksumVerifier {
            summer: HdfsChecksummer::new(&expected, types),
            expected,
        }
    }

    pub fn expected(&self) -> &HdfsChecksum {
        &self.expected
    }

    pub fn update(&mut self, data: &[u8]) {
        self.summer.update(data);
    }

    /// The CRC type whose checksum matched, or what was computed instead.
    pub fn finish(self) -> Result<CrcType, ChecksumMismatch> {
        let size = self.summer.len();
        let computed = self.summer.finish();
        if let Some((ty, _)) = computed.iter().find(|(_, c)| *c == self.expected) {
            return Ok(*ty);
        }
        Err(ChecksumMismatch {
            expected: self.expected.to_hex(),
            computed: computed.iter().map(|(t, c)| (*t, c.to_hex())).collect(),
            size,
        })
    }
}

/// The checks the Hive source's files carry, for the blob store
/// ([`stage::SourceChecks`]): the HDFS file checksum of
/// [`Verify::Hdfs`], through [`checksum_check`]. The pipeline hands it to
/// the store ([`stage::BlobStore::with_checks`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct HdfsChecks;

impl stage::SourceChecks for HdfsChecks {
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn stage::StreamCheck>>, String> {
        match verify {
            Verify::Hdfs { checksum } => checksum_check(checksum).map(Some),
            Verify::Sha256 { .. }
            | Verify::S3Etag { .. }
            | Verify::NotNewerThanEvent { .. }
            | Verify::None => Ok(None),
            Verify::Unproven { reason } => Err(reason.clone()),
        }
    }
}

/// The HDFS file checksum `expected` (hex) as a check the stager feeds
/// while copying; `Err` when `expected` is not an HDFS checksum.
///
/// The check computes CRC32C only (Hadoop's default `dfs.checksum.type`):
/// one CRC of every byte instead of two. When that does not match, its
/// [`CheckFailed`](stage::CheckFailed) offers a CRC32 check (older
/// clusters), which the stager feeds the stored copy again. So a file is
/// verified when either type matches, as with
/// [`ChecksumVerifier::new`], and always from the bytes staged;
/// only a file of an old cluster (or a wrong one) is read twice.
pub fn checksum_check(expected: &str) -> Result<Box<dyn stage::StreamCheck>, String> {
    let expected = HdfsChecksum::from_hex(expected).map_err(|e| e.to_string())?;
    Ok(Box::new(HdfsCheck {
        verifier: ChecksumVerifier::with_types(expected, &[CrcType::Crc32c]),
        earlier: None,
    }))
}

/// One CRC type's pass of an HDFS checksum check.
struct HdfsCheck {
    verifier: ChecksumVerifier,
    /// What the CRC32C pass computed, in the CRC32 pass after it.
    earlier: Option<Vec<(CrcType, String)>>,
}

impl stage::StreamCheck for HdfsCheck {
    fn update(&mut self, bytes: &[u8]) {
        self.verifier.update(bytes);
    }

    fn verify(self: Box<Self>) -> Result<(), stage::CheckFailed> {
        let HdfsCheck { verifier, earlier } = *self;
        let expected = *verifier.expected();
        let mut mismatch = match verifier.finish() {
            Ok(_) => return Ok(()),
            Err(mismatch) => mismatch,
        };
        match earlier {
            // An empty file, or a layout only an empty file has, computes
            // the same whatever the type: a second pass cannot match.
            None if mismatch.size > 0 && !mismatch.computed.is_empty() => Err(stage::CheckFailed {
                problem: mismatch.to_string(),
                again: Some(Box::new(HdfsCheck {
                    verifier: ChecksumVerifier::with_types(expected, &[CrcType::Crc32]),
                    earlier: Some(mismatch.computed),
                })),
            }),
            earlier => {
                // The message names what every type computed, CRC32C first.
                let mut computed = earlier.unwrap_or_default();
                computed.append(&mut mismatch.computed);
                mismatch.computed = computed;
                Err(stage::CheckFailed {
                    problem: mismatch.to_string(),
                    again: None,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let hex = "0000020000000000000000005d41402abc4b2a76b9719d911017c592";
        let c = HdfsChecksum::from_hex(hex).unwrap();
        assert_eq!(
            c,
            HdfsChecksum::Md5Md5Crc {
                bytes_per_crc: 512,
                crc_per_block: 0,
                md5: [
                    0x5d, 0x41, 0x40, 0x2a, 0xbc, 0x4b, 0x2a, 0x76, 0xb9, 0x71, 0x9d, 0x91, 0x10,
                    0x17, 0xc5, 0x92
                ],
            }
        );
        assert_eq!(c.to_hex(), hex);
        assert_eq!(HdfsChecksum::from_hex(&hex.to_uppercase()).unwrap(), c);
        assert_eq!(
            HdfsChecksum::from_hex("3799DB55").unwrap(),
            HdfsChecksum::CompositeCrc { crc: 0x3799db55 }
        );
        assert!(matches!(
            HdfsChecksum::from_hex("abc"),
            Err(ChecksumError::NotHex { .. })
        ));
        assert!(matches!(
            HdfsChecksum::from_hex("zz"),
            Err(ChecksumError::NotHex { .. })
        ));
        assert!(matches!(
            HdfsChecksum::from_hex("é"),
            Err(ChecksumError::NotHex { .. })
        ));
        assert!(matches!(
            HdfsChecksum::from_hex("00112233445566"),
            Err(ChecksumError::UnknownLength { bytes: 7, .. })
        ));
        let negative = "ffffffff0000000000000000".to_string() + &"00".repeat(16);
        assert!(matches!(
            HdfsChecksum::from_hex(&negative),
            Err(ChecksumError::BadValue { .. })
        ));
        let zero_bpc = "000000000000000000000004".to_string() + &"00".repeat(16);
        assert!(matches!(
            HdfsChecksum::from_hex(&zero_bpc),
            Err(ChecksumError::BadValue { .. })
        ));
    }

    #[test]
    fn empty_file_gives_hadoops_fixed_value() {
        assert_eq!(
            HdfsChecksum::empty_file().to_hex(),
            "00000000000000000000000070bc8f4b72a86921468bf8e8441dce51"
        );
        let v = ChecksumVerifier::new(HdfsChecksum::empty_file());
        assert_eq!(v.finish(), Ok(CrcType::Crc32));
        let mut v = ChecksumVerifier::new(HdfsChecksum::empty_file());
        v.update(b"x");
        let e = v.finish().unwrap_err();
        assert!(e.to_string().contains("empty file"), "{e}");
    }

    #[test]
    fn composite_crc_is_the_crc_of_the_whole_stream() {
        let expected = HdfsChecksum::CompositeCrc {
            crc: crc32c::crc32c(b"123456789"),
        };
        let mut v = ChecksumVerifier::new(expected);
        v.update(b"1234");
        v.update(b"56789");
        assert_eq!(v.finish(), Ok(CrcType::Crc32c));
        // The standard check values of both polynomials.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe3069283);
        assert_eq!(CrcType::Crc32.append(0, b"123456789"), 0xcbf43926);
    }
}

/// The Hive check through the blob store: the store verifies a copy with
/// it ([`stage::BlobStore::with_checks`]).
#[cfg(test)]
mod stage_tests {
    use std::fs;
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::stage::testing::*;
    use crate::stage::{BlobStore, FetchOutcome};

    /// A store that checks Hive's HDFS checksums.
    fn hive_store(fx: &Fixture) -> BlobStore {
        store(fx).with_checks(Arc::new(HdfsChecks))
    }

    #[test]
    fn hive_file_known_by_checksum_only_growing_mid_copy_is_unusable() {
        use CrcType;
        let fx = fixture();
        let content = multi_piece_content(2, 13);
        put(&fx.src, "t/000000_0", &content);
        let checksum = hdfs_hex(&content, CrcType::Crc32c);
        let f = hive_ref(&fx.src, "t/000000_0", Verify::Hdfs { checksum });
        let err = fetch_while_changing(&fx, hive_store(&fx), &f, append_to);
        assert!(err.contains("grew while reading"), "{err}");
    }

    /// The HDFS checksum (hex) of `bytes` as a cluster using `ty` reports
    /// it: 512 bytes per CRC, 1 MiB blocks.
    fn hdfs_hex(bytes: &[u8], ty: CrcType) -> String {
        use {HdfsChecksum, HdfsChecksummer};
        let shape = HdfsChecksum::Md5Md5Crc {
            bytes_per_crc: 512,
            crc_per_block: 2048,
            md5: [0; 16],
        };
        let mut summer = HdfsChecksummer::new(&shape, &[ty]);
        summer.update(bytes);
        summer.finish()[0].1.to_hex()
    }

    #[test]
    fn hdfs_checksum_of_either_crc_type_verifies_small_and_large_files() {
        use CrcType;
        let fx = fixture();
        let store = hive_store(&fx);
        let large = KERNEL_COPY_PIECE_BYTES as usize * 2 + 777;
        for (i, size) in [1000, large].into_iter().enumerate() {
            for (j, ty) in [CrcType::Crc32c, CrcType::Crc32].into_iter().enumerate() {
                let seed = i * 2 + j + 1;
                let content: Vec<u8> = (0..size).map(|k| (k * seed % 253) as u8).collect();
                let rel = format!("t/{seed:06}_0");
                put(&fx.src, &rel, &content);
                let checksum = hdfs_hex(&content, ty);
                let f = hive_ref(&fx.src, &rel, Verify::Hdfs { checksum });
                let outcome = store.fetch(&f, Path::new(""), None);
                assert_eq!(outcome.unwrap(), FetchOutcome::FromSource, "{size} {ty:?}");
                assert!(fs::read(store.path(&sha(&content))).unwrap() == content);
            }
        }
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn large_hive_file_with_a_wrong_checksum_is_taken_from_cm_and_a_mismatch_names_both_crc_types()
    {
        use CrcType;
        let fx = fixture();
        let store = hive_store(&fx);
        let good = multi_piece_content(2, 7);
        let mut corrupt = good.clone();
        corrupt[KERNEL_COPY_PIECE_BYTES as usize + 5] ^= 1;
        put(&fx.src, "t/000000_0", &corrupt);
        put(&fx.cm, "000000_0_x", &good);
        // An old cluster's CRC32 checksum: the good copy passes on the
        // second pass, the corrupt one on neither.
        let checksum = hdfs_hex(&good, CrcType::Crc32);
        let mut f = hive_ref(&fx.src, "t/000000_0", Verify::Hdfs { checksum });
        f.cm_path = Some(fx.cm.join("000000_0_x").display().to_string());
        f.cm_dir = Some(fx.cm.display().to_string());
        assert_eq!(
            store.fetch(&f, Path::new(""), None).unwrap(),
            FetchOutcome::FromChangeManagement
        );
        assert!(fs::read(store.path(&sha(&good))).unwrap() == good);

        // Wrong at both places: the error names what both CRC types gave.
        put(&fx.cm, "000000_0_x", &corrupt);
        fs::remove_file(store.path(&sha(&good))).unwrap();
        let err = store
            .fetch(&f, Path::new(""), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("HDFS checksum mismatch"), "{err}");
        assert!(err.contains("(CRC32C)") && err.contains("(CRC32)"), "{err}");
        assert_eq!(temp_count(&fx.state), 0);
    }
}
