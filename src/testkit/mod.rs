//! The test kit: what the tests, the examples (benchmarks) and nothing in
//! production use. Built only with the cargo feature `testkit`, which the
//! package's own dev-dependency on itself turns on for every test, example
//! and benchmark build; `cargo build` and the released binary leave it out.
//!
//! - [`checker`]: the consistency checker — reader threads that compare what
//!   a stagefs mount (or a naive state-transfer copy) shows with the
//!   workload's oracle, and a `stagefs mount` child process for them.
//! - [`hive_pipeline`]: the Hive pipeline tests' config and the native
//!   states they compare with.
//! - [`oracle`]: the crash tests' replication config and the check of a
//!   recovered state against the workload's oracle.
//! - [`metadata_log`]: a metadata-only native log and its oracle (many
//!   events quickly, nothing to fetch).
//! - [`source_files`]: source files and event lines written by hand.
//!
//! The changing warehouse they check against is [`crate::workload`], which
//! stays in the library because `stagefs demo` runs it too.

pub mod checker;
pub mod hive_pipeline;
pub mod metadata_log;
pub mod oracle;
pub mod source_files;
