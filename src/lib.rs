//! stagefs: the staging layer of warehouse replication.
//!
//! The modules follow the data flow:
//! source log → [`ingest`] → [`journal`] → [`stage`] (blobs) → [`catalog`]
//! (versions) → [`view`] (filesystem semantics) → [`fuse`] (kernel adapter).
//! [`daemon`] wires them together; [`status`] reports on them.

pub mod catalog;
pub mod durable;
pub mod event;
pub mod fuse;
pub mod journal;
pub mod stage;
pub mod view;
