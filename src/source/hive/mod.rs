//! The Hive metastore source: Hive's notification log (SPEC §2 "Hive
//! metastore source", docs/HIVE.md). [`model`] holds the
//! rows and the decoded messages that the other parts of this module share.
//!
//! Decoding is pure (no I/O): [`message`] turns a row into a
//! [`model::HiveMessage`], using [`thrift`] for the Thrift-JSON objects
//! inside messages and [`uri`] for file URIs and partition names;
//! [`checksum`] recomputes HDFS file checksums from bytes while staging.
//!
//! Following: [`files`] reads rows from `--hive-events` exports,
//! [`metastore`] from the metastore database; [`map`] is `--source-map`;
//! [`adapter`] turns rows into stagefs events (the [`crate::source::Source`]),
//! with [`ahead`] decoding the polled rows' messages on worker threads and
//! [`rows_ahead`] reading the next batch of rows on a thread of its own.

pub mod adapter;
pub mod ahead;
pub mod checksum;
pub mod files;
pub mod map;
pub mod message;
pub mod metastore;
pub mod model;
pub mod rows_ahead;
pub mod thrift;
pub mod uri;

pub use adapter::{HiveConfig, HiveRows, HiveSource};

/// The HDFS file checksum `expected` (hex) as a check the stager feeds
/// while copying; `Err` when `expected` is not an HDFS checksum.
///
/// The check computes CRC32C only (Hadoop's default `dfs.checksum.type`):
/// one CRC of every byte instead of two. When that does not match, its
/// [`CheckFailed`](crate::stage::CheckFailed) offers a CRC32 check (older
/// clusters), which the stager feeds the stored copy again. So a file is
/// verified when either type matches, as with
/// [`checksum::ChecksumVerifier::new`], and always from the bytes staged;
/// only a file of an old cluster (or a wrong one) is read twice.
pub fn checksum_check(expected: &str) -> Result<Box<dyn crate::stage::StreamCheck>, String> {
    let expected = checksum::HdfsChecksum::from_hex(expected).map_err(|e| e.to_string())?;
    Ok(Box::new(HdfsCheck {
        verifier: checksum::ChecksumVerifier::with_types(expected, &[checksum::CrcType::Crc32c]),
        earlier: None,
    }))
}

/// One CRC type's pass of an HDFS checksum check.
struct HdfsCheck {
    verifier: checksum::ChecksumVerifier,
    /// What the CRC32C pass computed, in the CRC32 pass after it.
    earlier: Option<Vec<(checksum::CrcType, String)>>,
}

impl crate::stage::StreamCheck for HdfsCheck {
    fn update(&mut self, bytes: &[u8]) {
        self.verifier.update(bytes);
    }

    fn verify(self: Box<Self>) -> Result<(), crate::stage::CheckFailed> {
        let HdfsCheck { verifier, earlier } = *self;
        let expected = *verifier.expected();
        let mut mismatch = match verifier.finish() {
            Ok(_) => return Ok(()),
            Err(mismatch) => mismatch,
        };
        match earlier {
            // An empty file, or a layout only an empty file has, computes
            // the same whatever the type: a second pass cannot match.
            None if mismatch.size > 0 && !mismatch.computed.is_empty() => {
                Err(crate::stage::CheckFailed {
                    problem: mismatch.to_string(),
                    again: Some(Box::new(HdfsCheck {
                        verifier: checksum::ChecksumVerifier::with_types(
                            expected,
                            &[checksum::CrcType::Crc32],
                        ),
                        earlier: Some(mismatch.computed),
                    })),
                })
            }
            earlier => {
                // The message names what every type computed, CRC32C first.
                let mut computed = earlier.unwrap_or_default();
                computed.append(&mut mismatch.computed);
                mismatch.computed = computed;
                Err(crate::stage::CheckFailed {
                    problem: mismatch.to_string(),
                    again: None,
                })
            }
        }
    }
}
