//! The test kit: what the tests, the examples (benchmarks) and nothing in
//! production use. Built only with the cargo feature `testkit`, which the
//! package's own dev-dependency on itself turns on for every test, example
//! and benchmark build; `cargo build` and the released binary leave it out.
//!
//! - [`checker`]: the consistency checker — reader threads that compare what
//!   a stagefs mount (or a naive state-transfer copy) shows with the
//!   workload's oracle, and a `stagefs mount` child process for them.
//!
//! The changing warehouse they check against is [`crate::workload`], which
//! stays in the library because `stagefs demo` runs it too.

pub mod checker;
