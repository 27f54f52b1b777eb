//! Decoding ahead: the messages of polled rows decoded on worker threads
//! while the ingest thread validates, applies and journals the rows before
//! them.
//!
//! [`super::message::decode_message`] (base64, gunzip, JSON, Thrift-JSON) is a
//! pure function of the row, and the most expensive step of a Hive event,
//! so the adapter hands every polled row to [`DecodeAhead::submit`] and
//! takes each row's result with [`DecodeAhead::take`] when the ingest loop
//! reaches it. An INSERT's files are also mapped there
//! (`file_refs::premap_files`: `--source-map`, checksum, reference key; a
//! pure function of the message, the event id and the map). Everything
//! that depends on the replica's state (the rest of the mapping against
//! the newest tree, the transaction-log lookups, validation) stays on the
//! ingest thread.
//!
//! Invariants:
//! - results are taken in id order: row *i* of a submission goes to worker
//!   *i mod n*, each worker decodes its rows in order and answers in order,
//!   so the next answer of that worker is row *i*'s;
//! - a result is exactly what `decode_message` (and `premap_files`) give
//!   for the row, errors included: the ingest loop sees the same outcome
//!   at the same row as when it decoded the row itself, so a bad row
//!   after good ones stops replication at the same event, after the good
//!   ones are journaled;
//! - bounded: at most two submissions (the adapter's batch being taken and
//!   the one it read ahead, each at most its batch of rows) are in flight; a
//!   submission continues the one before it (rows are assigned to workers
//!   round-robin across submissions), and the adapter discards what it will
//!   not take (rows read past a rejection, re-read after a rewind, a batch
//!   read ahead and forgotten);
//! - a row that was not submitted, or whose worker is gone, is decoded on
//!   the calling thread.
//!
//! Owned by [`super::adapter::HiveSource`]; its threads end when it is dropped.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::file_refs::premap_files;
use super::map::SourceMap;
use super::message::{decode_message, DecodeError};
use super::model::{HiveMessage, NotificationRow};
use crate::event::FileRef;

/// One row's message, decoded.
#[derive(Debug)]
pub struct Decoded {
    pub message: HiveMessage,
    /// An INSERT's files mapped by a decoding thread, in order (None: the
    /// ingest thread maps them).
    pub files: Option<Vec<Result<FileRef, String>>>,
}

/// What decoding one row gave.
pub type Outcome = Result<Decoded, DecodeError>;

/// What a decoding thread computes for `row`.
fn decode_ahead(row: &NotificationRow, map: &SourceMap) -> Outcome {
    let message = decode_message(row)?;
    let time_ms = row.event_time.map(|s| s.saturating_mul(1000));
    let files = premap_files(map, row.event_id, time_ms, &message);
    Ok(Decoded { message, files })
}

/// What the ingest thread computes for a row not decoded ahead.
fn decode_inline(row: &NotificationRow) -> Outcome {
    decode_message(row).map(|message| Decoded {
        message,
        files: None,
    })
}

/// The default number of decoding threads: one per core, at most 4 (the
/// ingest thread's own work bounds what more threads could give).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 4))
}

struct Worker {
    jobs: Option<Sender<NotificationRow>>,
    results: Receiver<(i64, Outcome)>,
    thread: Option<JoinHandle<()>>,
}

/// See the module docs.
pub struct DecodeAhead {
    workers: Vec<Worker>,
    /// Submitted rows not taken yet, in submission (id) order: (event id, worker).
    pending: VecDeque<(i64, usize)>,
    /// The worker of the next submitted row.
    next_worker: usize,
}

impl DecodeAhead {
    /// `threads` decoding threads mapping files through `map`; 0 decodes
    /// every row on the caller's thread.
    pub fn new(threads: usize, map: &SourceMap) -> DecodeAhead {
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (jobs, job_rx) = mpsc::channel::<NotificationRow>();
            let (result_tx, results) = mpsc::channel();
            let map = map.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("stagefs-hive-decode-{i}"))
                .spawn(move || {
                    for row in job_rx {
                        let decoded = decode_ahead(&row, &map);
                        if result_tx.send((row.event_id, decoded)).is_err() {
                            return;
                        }
                    }
                });
            match spawned {
                Ok(thread) => workers.push(Worker {
                    jobs: Some(jobs),
                    results,
                    thread: Some(thread),
                }),
                Err(e) => {
                    // Fewer threads (or none: decoding on the caller's) work the same, slower.
                    tracing::warn!(error = %e, "cannot start a Hive decoding thread");
                    break;
                }
            }
        }
        DecodeAhead {
            workers,
            pending: VecDeque::new(),
            next_worker: 0,
        }
    }

    /// Starts decoding `rows` (in id order, after every row submitted and
    /// not taken or discarded yet).
    pub fn submit(&mut self, rows: &[NotificationRow]) {
        if self.workers.is_empty() {
            return;
        }
        for row in rows {
            let w = self.next_worker % self.workers.len();
            self.next_worker = (w + 1) % self.workers.len();
            let sent = self.workers[w]
                .jobs
                .as_ref()
                .is_some_and(|jobs| jobs.send(row.clone()).is_ok());
            if !sent {
                // The worker is gone: this row and the ones after it are
                // decoded by the caller (pending must stay in order).
                return;
            }
            self.pending.push_back((row.event_id, w));
        }
    }

    /// The decoded message of `row`: the workers' result when `row` is the
    /// next submitted row not taken yet, else decoded here.
    pub fn take(&mut self, row: &NotificationRow) -> Outcome {
        while let Some(&(id, w)) = self.pending.front() {
            if id > row.event_id {
                break;
            }
            self.pending.pop_front();
            let answer = self.workers[w].results.recv();
            if id == row.event_id {
                match answer {
                    Ok((got, decoded)) if got == id => return decoded,
                    _ => {
                        self.give_up();
                        break;
                    }
                }
            } else if answer.is_err() {
                self.give_up();
                break;
            }
        }
        decode_inline(row)
    }

    /// Waits for and drops every result not taken.
    pub fn discard(&mut self) {
        while let Some((_, w)) = self.pending.pop_front() {
            if self.workers[w].results.recv().is_err() {
                self.give_up();
            }
        }
    }

    /// A worker died (a panic in decoding): from now on every row is
    /// decoded on the caller's thread, which meets the same failure itself.
    fn give_up(&mut self) {
        self.pending.clear();
        // Dropping the senders ends the other workers; their answers go
        // with the receivers.
        self.workers.clear();
    }
}

impl Drop for DecodeAhead {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.jobs = None;
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}
