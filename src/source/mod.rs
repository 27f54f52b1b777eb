//! Sources of events: the native JSONL log (`ingest`, for tests and demos)
//! and Hive's notification log ([`hive`]).

pub mod hive;
