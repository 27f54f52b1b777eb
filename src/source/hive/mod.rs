//! The Hive metastore source: Hive's notification log (SPEC §2 "Hive
//! metastore source", docs/HIVE.md). [`model`] holds the
//! rows and the decoded messages that the other parts of this module share.
//!
//! Decoding is pure (no I/O): [`message`] turns a row into a
//! [`model::HiveMessage`], using [`thrift`] for the Thrift-JSON objects
//! inside messages and [`uri`] for file URIs and partition names;
//! [`checksum`] recomputes HDFS file checksums from bytes while staging
//! (the store's check for them is [`HdfsChecks`]).
//!
//! Following: [`files`] reads rows from `--hive-events` exports,
//! [`metastore`] from the metastore database; [`map`] is `--source-map`;
//! [`adapter`] turns rows into stagefs events (the [`crate::source::Source`]),
//! with [`ahead`] decoding the polled rows' messages on worker threads and
//! [`rows_ahead`] reading the next batch of rows on a thread of its own.

pub mod adapter;
pub mod ahead;
pub mod checksum;
pub mod file_refs;
pub mod files;
pub mod map;
pub mod message;
pub mod metastore;
pub mod model;
pub mod partition_listing;
pub mod rows_ahead;
pub mod thrift;
pub mod tls;
pub mod uri;

pub use adapter::{HiveConfig, HiveRows, HiveSource};
pub use checksum::{checksum_check, HdfsChecks};
