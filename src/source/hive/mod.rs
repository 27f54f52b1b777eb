//! The Hive metastore source: Hive's notification log (SPEC §2 "Hive
//! metastore source", ../shared/HIVE.md, docs/HIVE.md). [`model`] holds the
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
//! with [`ahead`] decoding the polled rows' messages on worker threads.

pub mod adapter;
pub mod ahead;
pub mod checksum;
pub mod files;
pub mod map;
pub mod message;
pub mod metastore;
pub mod model;
pub mod thrift;
pub mod uri;

pub use adapter::{HiveConfig, HiveRows, HiveSource};

/// The HDFS file checksum `expected` (hex) as a check the stager feeds
/// while copying; `Err` when `expected` is not an HDFS checksum.
pub fn checksum_check(expected: &str) -> Result<Box<dyn crate::stage::StreamCheck>, String> {
    let verifier = checksum::ChecksumVerifier::from_hex(expected).map_err(|e| e.to_string())?;
    Ok(Box::new(verifier))
}

impl crate::stage::StreamCheck for checksum::ChecksumVerifier {
    fn update(&mut self, bytes: &[u8]) {
        checksum::ChecksumVerifier::update(self, bytes);
    }

    fn verify(self: Box<Self>) -> Result<(), String> {
        self.finish().map(|_| ()).map_err(|e| e.to_string())
    }
}
