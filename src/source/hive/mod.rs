//! The Hive metastore source: Hive's notification log (SPEC §2 "Hive
//! metastore source", ../shared/HIVE.md). [`model`] holds the rows and the
//! decoded messages that the other parts of this module share.

pub mod metastore;
pub mod model;
