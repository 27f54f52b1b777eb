//! stagefs: the staging layer of warehouse replication.
//!
//! The modules follow the data flow:
//! source ([`source`]: native JSONL or Hive) → [`journal`] → [`stage`] (blobs) → [`catalog`]
//! (versions) → [`view`] (filesystem semantics) → [`fuse`] (kernel adapter).
//! [`replicate`] runs the pipeline threads, one file each; [`daemon`],
//! [`run`], [`demo`] and [`check`] (the pre-flight checks) are the
//! commands, [`mount_helper`] their `/etc/fstab` entry; [`status`] reports on them
//! ([`metrics`] exports it to Prometheus, with the [`latency`] histograms);
//! [`publish`] writes the visible states to shared storage for reader hosts;
//! [`follow`] serves them on a reader host.
//! [`workload`] generates the changing warehouse of the demo, the tests and
//! the benchmarks. The test kit (the consistency checker) is `testkit`, built
//! only with the cargo feature `testkit` (the tests, examples and benchmarks
//! enable it). `scripts/import-graph.py` checks that no module imports one
//! that imports it back.

pub mod bootstrap;
pub mod catalog;
pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod durable;
pub mod event;
pub mod follow;
pub mod fuse;
pub mod fusermount;
pub mod journal;
pub mod latency;
pub mod lease_cmd;
pub mod metrics;
pub mod mount_helper;
pub mod publish;
pub mod redact;
pub mod replicate;
pub mod run;
pub mod source;
pub mod source_file;
pub mod stage;
pub mod state_lock;
pub mod status;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod view;
pub mod workload;
