//! stagefs: the staging layer of warehouse replication.
//!
//! The modules follow the data flow:
//! source ([`source`]: native JSONL or Hive) → [`journal`] → [`stage`] (blobs) → [`catalog`]
//! (versions) → [`view`] (filesystem semantics) → [`fuse`] (kernel adapter).
//! [`replicate`] runs the pipeline threads; [`daemon`], [`run`] and [`demo`]
//! are the commands; [`status`] reports on them ([`metrics`] exports it to
//! Prometheus); [`workload`] generates test warehouses.

pub mod bootstrap;
pub mod catalog;
pub mod checker;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod durable;
pub mod event;
pub mod fuse;
pub mod fusermount;
pub mod hive_writer;
pub mod journal;
pub mod metrics;
pub mod redact;
pub mod replicate;
pub mod run;
pub mod source;
pub mod source_open;
pub mod stage;
pub mod status;
pub mod view;
pub mod workload;
