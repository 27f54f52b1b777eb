//! The Hive metastore source: Hive's notification log (SPEC §2 "Hive
//! metastore source", ../shared/HIVE.md). [`model`] holds the rows and the
//! decoded messages that the other parts of this module share.
//!
//! Decoding is pure (no I/O): [`message`] turns a row into a
//! [`model::HiveMessage`], using [`thrift`] for the Thrift-JSON objects
//! inside messages and [`uri`] for file URIs and partition names;
//! [`checksum`] recomputes HDFS file checksums from bytes while staging.

pub mod checksum;
pub mod message;
pub mod model;
pub mod thrift;
pub mod uri;
