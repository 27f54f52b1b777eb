//! The content-addressed blob store under `<state>/blobs/`, and the fetch of
//! one source file into it (DESIGN "stager", SPEC §3 rule 2).
//!
//! Owns every file below `<state>/blobs/`:
//! - `blobs/<ab>/<abcd…>`: one blob per distinct sha256 (64 lower-case hex
//!   digits, fanned out by the first two), holding exactly the bytes that hash
//!   to its name;
//! - `blobs/tmp/<0-15>/`: temp files of fetches in progress, all removed by
//!   [`BlobStore::open`] because after a crash they are garbage.
//!
//! Invariants:
//! - A blob path only ever holds verified, durable bytes: a fetch copies into
//!   a temp file while counting and hashing and compares size and sha256
//!   with the [`FileRef`](crate::event::FileRef); then either [`BlobStore::fetch`] `sync_data`s it,
//!   renames it into place (never replacing an existing blob) and fsyncs the
//!   fan-out directory (and `blobs/` when the fan-out directory is new), or
//!   [`BlobStore::fetch_unsynced`] leaves it in `tmp/` for
//!   [`BlobStore::publish`] to make a whole group durable at once:
//!   `fdatasync` of every temp through its own descriptor (in parallel;
//!   a copy the caller already synced with [`Unsynced::sync_data`] is not
//!   synced twice), the renames, one fsync per touched fan-out directory
//!   (in parallel too); or, for a group of [`GROUP_SYNC_MIN`] or more on a
//!   local disk filesystem ([`GroupSync`]), one `syncfs`, each copy's own
//!   writeback result, the renames and one more `syncfs`. A fan-out
//!   directory a group creates becomes durable in `blobs/` with that
//!   group's renames (one fsync of `blobs/` among the directory fsyncs, or
//!   the second `syncfs`), not by a sync of its own. So a blob present
//!   after a crash is complete, and a blob at its path is durable
//!   (durability order, step 1).
//! - Same content is stored once, whatever file names reference it.
//! - [`BlobStore::staged_bytes`] is the total size of the stored blobs (and
//!   [`BlobStore::stored_blobs`] their number): scanned
//!   on open, then kept up to date by fetch and remove.
//!
//! Source and change-management files are read through
//! [`crate::source_file`] (its [`Location`](crate::source_file::Location)
//! and [`SourceFile`](crate::source_file::SourceFile)); a local one is
//! opened only beneath its root and only when regular: a symlink out of the
//! root, a FIFO or a device node is a source problem like a missing file.
//! A native file's root is `--source-root` (or `--cm-root`); a Hive file's
//! is the `--source-map` directory its URI (or its cm root's URI) was
//! mapped through ([`FileRef::source_dir`](crate::event::FileRef::source_dir),
//! [`FileRef::cm_dir`](crate::event::FileRef::cm_dir)).
//!
//! Errors split by side: whatever is wrong at the *source* (missing, not
//! readable, escaping its root, not a regular file, wrong size, wrong
//! sha256, read error) makes that copy unusable and
//! the next place is tried; when none is usable the fetch fails with
//! [`StageError::Unavailable`] naming what was found where. Failures in the
//! *store* itself end the fetch at once: [`StageError::NoSpace`] for a full
//! disk, [`StageError::Io`] for anything else. The caller retries all of them
//! with [`backoff`].
//!
//! Called by the stager's fetch workers (in parallel: every method takes
//! `&self`), by the committer (`contains`), by GC (`list`, `remove`) and by
//! the status report (`staged_bytes`). The daemon's state lock guarantees one
//! process per store; within it, GC must not remove a blob that a fetch or a
//! retained version still needs.
//!
//! The parts, by job, each using only those listed before it: `heartbeat`
//! (signs of progress for the fetch deadline), `origins` (where a file is
//! looked for), `tmp` (the temp files copies are made in), `verify` (size,
//! sha256 and the checksums a source's files carry, [`SourceChecks`]),
//! `copy` (the copy engines: in the kernel, pipelined, sequential; and the
//! verified copy of one place), `placement` (a verified copy renamed into
//! its fan-out directory, durably; the blobs' paths and counts),
//! `durability` (a group made durable at once, [`GroupSync`]) and, on top,
//! `store` ([`BlobStore`] itself, which wires them: the fetch of a file
//! from the first place that has it, publishing, removal and listing).

mod copy;
mod durability;
mod heartbeat;
mod origins;
mod placement;
mod store;
#[cfg(test)]
mod test_hooks;
#[cfg(test)]
pub(crate) mod testing;
mod tmp;
mod verify;

use std::io;
use std::path::Path;
use std::time::Duration;

pub use durability::{GroupSync, Unsynced, GROUP_SYNC_MIN, PUBLISH_SYNC_THREADS};
pub use heartbeat::{heartbeat, watch_this_thread, ProgressWatch};
pub use store::{BlobStore, Fetched};
pub use verify::{CheckFailed, EventTimeMargin, SourceChecks, StreamCheck};

/// Where a fetched blob came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchOutcome {
    /// The blob was already stored; nothing was copied.
    AlreadyPresent,
    /// Copied from `source_root/<path>`.
    FromSource,
    /// Copied from the change-management root.
    FromChangeManagement,
}

/// Why a fetch (or another store operation) failed. All are transient from
/// the stager's point of view: it retries with [`backoff`].
#[derive(thiserror::Error, Debug)]
pub enum StageError {
    /// Neither the source nor the change-management root has a verified copy.
    /// `detail` says what was found at each place, naming the paths.
    #[error("{path} is unavailable: {detail}")]
    Unavailable { path: String, detail: String },
    /// The disk holding the store is full (ENOSPC / EDQUOT); replication
    /// resumes once space is freed.
    #[error("disk full writing {path}")]
    NoSpace { path: String },
    /// Any other I/O error in the store; `context` is a verb phrase with the path.
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    /// Reading the source made no progress for `after` (a hung NFS or FUSE
    /// source): the fetch workers abandoned the attempt
    /// (`replicate::fetch`).
    #[error("read timed out after {after:?} with no progress")]
    TimedOut { after: Duration },
}

impl StageError {
    /// Every stage error may clear up on its own (the file arrives, space is
    /// freed, the disk recovers), so the stager retries all of them.
    pub fn is_retryable(&self) -> bool {
        match self {
            StageError::Unavailable { .. }
            | StageError::NoSpace { .. }
            | StageError::Io { .. }
            | StageError::TimedOut { .. } => true,
        }
    }

    /// Short label for the status report's `stalled.reason`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            StageError::Unavailable { .. } => "unavailable",
            StageError::NoSpace { .. } => "disk full",
            StageError::Io { .. } => "io",
            StageError::TimedOut { .. } => "timed out",
        }
    }
}

/// Delay before retry number `attempt` (0-based) of a failed fetch: 100 ms,
/// doubling, capped at 10 s (SPEC §3 rule 2).
pub fn backoff(attempt: u32) -> Duration {
    const FIRST_MS: u64 = 100;
    const CAP_MS: u64 = 10_000;
    let factor = 1u64.checked_shl(attempt).unwrap_or(u64::MAX);
    Duration::from_millis(FIRST_MS.saturating_mul(factor).min(CAP_MS))
}

/// Classifies a store-side I/O error: a full disk is its own kind so the
/// status can say so.
fn store_error(verb: &str, path: &Path, e: io::Error) -> StageError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => StageError::NoSpace {
            path: path.display().to_string(),
        },
        _ => StageError::Io {
            context: format!("{verb} {}", path.display()),
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_exponential_and_capped_at_10s() {
        let ms = |a| backoff(a).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3)], [100, 200, 400, 800]);
        assert_eq!(ms(6), 6400);
        assert_eq!(ms(7), 10_000);
        assert_eq!(ms(40), 10_000);
        assert_eq!(ms(u32::MAX), 10_000);
    }
}
