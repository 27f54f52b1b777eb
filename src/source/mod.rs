//! Sources of events, behind one interface ([`Source`]): the native JSONL
//! log ([`native`], `--events`) and Hive's notification log ([`hive`],
//! `--hive-metastore` or `--hive-events`).
//!
//! A source reads records and turns each into a validated [`Event`] (the
//! same model whatever the source) against the newest accepted state;
//! [`Validator`] then decides acceptance (increasing ids, identical
//! re-deliveries ignored, the event applies). The ingest thread
//! (`replicate`) journals each accepted event with the source's
//! [`Position`] after it, so a restart resumes exactly there; nothing after
//! the journal knows which source it follows.

pub mod hive;
pub mod native;
mod validate;

use serde::{Deserialize, Serialize};

use crate::catalog::Tree;
use crate::event::{Event, StateId};
use crate::status::{SourceReport, Stall};

pub use validate::{Accepted, DupWindow, Validator, Verdict, DUPLICATE_WINDOW};

/// Where a source continues after an event; journaled with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Position {
    /// Native log: the next unread line.
    Log(native::LogPosition),
    /// Hive: the last `EVENT_ID` read (the next poll asks for ids above it).
    Hive { hive_event_id: i64 },
}

/// Why a record was not accepted: replication stops at the last good state
/// with this in status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// The event id when it could be read.
    pub state_id: Option<StateId>,
    /// Source file and line, for sources made of lines.
    pub file: Option<String>,
    pub line: Option<u64>,
    pub reason: String,
}

impl Rejection {
    /// A rejection of event `id` that names no file.
    pub fn of_event(id: StateId, reason: impl Into<String>) -> Rejection {
        Rejection {
            state_id: Some(id),
            file: None,
            line: None,
            reason: reason.into(),
        }
    }

    /// The status `stalled` entry for it.
    pub fn stall(&self) -> Stall {
        Stall {
            state_id: self.state_id,
            reason: self.to_string(),
            file: self.file.clone(),
            line: self.line,
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = match (&self.file, self.line) {
            (Some(file), Some(line)) => format!("{file}:{line}"),
            (Some(file), None) => file.clone(),
            _ => String::new(),
        };
        match (self.state_id, at.is_empty()) {
            (Some(id), false) => write!(f, "event {id} at {at}: {}", self.reason),
            (Some(id), true) => write!(f, "event {id}: {}", self.reason),
            (None, false) => write!(f, "{at}: {}", self.reason),
            (None, true) => f.write_str(&self.reason),
        }
    }
}

/// Why a source could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// Worth retrying (a file not readable right now, a metastore that is
    /// down): ingest backs off and keeps the mount serving.
    Transient(String),
    /// The source can never go on from here (a gap, a repeated id, a line
    /// that can never be read): replication stops at the last good state.
    Fatal(Rejection),
}

/// Why a record could not become an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Bad input: stop at the last good state.
    Rejected(Rejection),
    /// Something it needs cannot be read now (a transaction's write rows
    /// while the metastore is down): try the same record again later.
    Retry(String),
}

impl From<Rejection> for DecodeError {
    fn from(r: Rejection) -> DecodeError {
        DecodeError::Rejected(r)
    }
}

/// A source of events. One ingest thread owns it and calls, in a loop,
/// [`Source::poll`] and then [`Source::decode`] on each record in order,
/// validating each event before decoding the next.
pub trait Source: Send {
    type Record: Send;

    /// Up to `max` records available now (empty when caught up).
    fn poll(&mut self, max: usize) -> Result<Vec<Self::Record>, SourceError>;

    /// The event `record` stands for, given the newest accepted state
    /// (Hive's mapping looks up tables and partitions there).
    fn decode(&mut self, record: &Self::Record, latest: &Tree) -> Result<Event, DecodeError>;

    /// Where the source continues after `record`.
    fn position_after(&self, record: &Self::Record) -> Position;

    /// Where `record` is, for rejections that happen after decoding.
    fn locate(&self, record: &Self::Record) -> (Option<String>, Option<u64>);

    /// Status of the source (cheap: called after every batch).
    fn report(&mut self) -> SourceReport;

    /// How long to sleep when caught up.
    fn idle_wait(&self) -> std::time::Duration;

    /// Whether the next [`Source::poll`] returns at once with records read
    /// already (the Hive source's batch read ahead): the ingest loop then
    /// leaves the previous batch's fsync running while it polls.
    fn more_ready(&self) -> bool {
        false
    }

    /// After a rejection: checks whether the source may hold something new
    /// from `at` (the position after the last record ingest took, so the
    /// rejected record is the next one) — a corrected line or row. When it
    /// may, forgets everything read after `at` and returns true: the next
    /// [`Source::poll`] reads from `at` again. Nothing at or before `at` is
    /// ever read again, so a correction never re-applies an accepted event.
    fn reread_from(&mut self, at: &Position) -> bool;
}
